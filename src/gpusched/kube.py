"""Connecting to the API server: one place that turns a kubeconfig (or the in-cluster service
account) into a ``kubernetes`` client, for every component and the CLI."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from kubernetes import client, config


def body(manifest: Mapping[str, Any]) -> Any:
    """A plain manifest as a request body. The generated client sends dicts as they are; only
    its annotations name model classes, so this is where that mismatch is stated, once."""
    return manifest


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


#: Default (connect, read) deadline of every call that does not set its own.
DEFAULT_TIMEOUT: Final = (10.0, 120.0)


class _DeadlineApiClient(client.ApiClient):
    """An ApiClient whose calls end even when a connection dies silently.

    The generated client waits forever by default; one call stuck on a half-open connection
    (an API server or load balancer failing over) would stall the operator's cycle or the
    probe's loop with nothing logged. Calls that pass ``_request_timeout`` (watches) keep it.
    """

    def __init__(self, configuration: client.Configuration, timeout: tuple[float, float]) -> None:
        super().__init__(configuration)
        self._default_timeout = timeout

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        return super().call_api(
            method,
            url,
            header_params,
            body,
            post_params,
            _request_timeout if _request_timeout is not None else self._default_timeout,
        )


def api_client(
    kubeconfig: str | Path | None = None,
    *,
    connections: int = 32,
    timeout: tuple[float, float] = DEFAULT_TIMEOUT,
) -> client.ApiClient:
    """A client for :func:`load_configuration`'s configuration. ``connections`` sizes the
    connection pool, which must match the number of threads that use the client at once (the
    default of 4 serialises them); ``timeout`` is the default (connect, read) deadline."""
    configuration = load_configuration(kubeconfig)
    configuration.connection_pool_maxsize = connections
    return _DeadlineApiClient(configuration, timeout)
