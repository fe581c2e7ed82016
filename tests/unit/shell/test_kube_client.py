"""Every API call made through gpusched's client has a deadline unless it sets its own."""

from __future__ import annotations

import contextlib
from typing import Any

from gpusched import kube
from gpusched.dev.localcluster import pki


def test_calls_without_their_own_timeout_get_the_default_deadline(
    tmp_path: Any, monkeypatch: Any
) -> None:
    ca = pki.CertificateAuthority.create(tmp_path)
    pair = ca.issue("user", "user")
    path = pki.write_kubeconfig(
        tmp_path / "kc", "https://127.0.0.1:1", ca.cert_path, "u", credentials=pair
    )
    api = kube.api_client(path, timeout=(1.0, 2.0))
    seen: list[Any] = []

    def fake_request(self: Any, method: str, url: str, **kwargs: Any) -> None:
        seen.append(kwargs.get("_request_timeout"))
        raise RuntimeError("stop")

    monkeypatch.setattr(type(api.rest_client), "request", fake_request)
    for timeout in (None, 5):
        with contextlib.suppress(RuntimeError):
            api.call_api("GET", "https://127.0.0.1:1/api", _request_timeout=timeout)
    assert seen == [(1.0, 2.0), 5]
