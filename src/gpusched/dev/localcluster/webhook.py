"""The operator's validating webhook on the local control plane: a test CA and a serving
certificate for 127.0.0.1 (``trustme``, a development dependency), and the chart's own
ValidatingWebhookConfiguration pointed at a local operator process instead of its Service."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from gpusched.dev.chart import render


def write_certificates(directory: Path) -> bytes:
    """``tls.crt`` and ``tls.key`` for 127.0.0.1 in ``directory``; the CA's PEM."""
    import trustme

    ca = trustme.CA()
    served = ca.issue_cert("127.0.0.1", "localhost")
    directory.mkdir(parents=True, exist_ok=True)
    served.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
    served.private_key_pem.write_to_path(str(directory / "tls.key"))
    return ca.cert_pem.bytes()


def webhook_configuration(name: str, port: int, ca_pem: bytes) -> dict[str, Any]:
    """The chart's ValidatingWebhookConfiguration named ``name``, its Service swapped for
    ``https://127.0.0.1:port`` (same paths, rules and failure policy)."""
    (config,) = [o for o in render.render() if o["kind"] == "ValidatingWebhookConfiguration"]
    config["metadata"] = {"name": name}
    for hook in config["webhooks"]:
        service = hook["clientConfig"].pop("service")
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}{service['path']}",
            "caBundle": base64.b64encode(ca_pem).decode(),
        }
    return config
