"""The kube-scheduler extender: HTTP service, watch cache and binder (a shell around
``gpusched.core.scheduling``)."""
