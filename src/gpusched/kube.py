"""Connecting to the API server: one place that turns a kubeconfig (or the in-cluster service
account) into a ``kubernetes`` client, for every component and the CLI."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config


def load_configuration(kubeconfig: str | Path | None = None) -> client.Configuration:
    """Client configuration for ``kubeconfig``; else ``$KUBECONFIG``; else the pod's service
    account; else ``~/.kube/config``."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = client.Configuration()
    # kubernetes.config is untyped (the generated client is typed).
    if path:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(path), client_configuration=configuration, persist_config=False
        )
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration, persist_config=False
        )
    return configuration


def api_client(kubeconfig: str | Path | None = None, *, connections: int = 32) -> client.ApiClient:
    """A client for :func:`load_configuration`'s configuration. ``connections`` sizes the
    connection pool, which must match the number of threads that use the client at once (the
    default of 4 serialises them)."""
    configuration = load_configuration(kubeconfig)
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)
