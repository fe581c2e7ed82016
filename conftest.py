"""Root conftest: the local-cluster fixtures are available to every test directory."""

pytest_plugins = ["gpusched.dev.localcluster.pytest_plugin"]
