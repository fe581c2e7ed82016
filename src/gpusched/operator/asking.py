"""``gpusched explain``'s side of :mod:`gpusched.operator.answers`: ask the leading operator,
through the API server's proxy to the operator's Service (the caller's own credentials and
RBAC: the chart's ``explain`` Role) or at a URL given (a port-forward, a local operator).

The Service picks a replica per request and only the leader answers; a standby's 503 is asked
again a few times. When no leader answers, the caller decides itself
(:func:`gpusched.operator.explainer.explain_in_cluster`), which is slower but needs no operator.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpusched.kubeasync import ApiError, BlockingApi

#: Times a standby's (or a starting leader's) 503 is asked again before giving up.
ATTEMPTS = 6
#: Seconds the counterfactual may take (each variant is a cycle and a forecast).
SOONER_TIMEOUT = 120.0
#: Seconds the explanation may take.
EXPLAIN_TIMEOUT = 10.0


class NoAnswerError(RuntimeError):
    """No operator replica answered (none leads, none is reachable, or access is refused)."""


class JobUnknownError(LookupError):
    """The leader's last cycle has no such job."""


@dataclass(frozen=True)
class Reply:
    """One answer: HTTP status and decoded body."""

    status: int
    body: dict[str, Any]


#: Sends ``GET path`` (relative to the answers' root) and returns the reply.
Fetch = Callable[[str, float], Reply]


def through_proxy(kube: BlockingApi, namespace: str, service: str, port: str) -> Fetch:
    """Requests through the API server's proxy to ``service``'s ``port`` (a port name)."""
    root = f"/api/v1/namespaces/{namespace}/services/http:{service}:{port}/proxy"

    def fetch(path: str, timeout: float) -> Reply:
        try:
            return Reply(200, kube.request("GET", root + path, timeout=timeout))
        except ApiError as err:
            return Reply(err.status, {"reason": err.reason, "message": err.message})
        except TimeoutError:
            # The operator (or the proxy to it) is slow, not the API server gone: the caller
            # decides itself rather than report the API server unreachable.
            return Reply(0, {"reason": "Timeout", "message": f"no answer within {timeout:.0f}s"})

    return fetch


def at_url(url: str) -> Fetch:
    """Requests straight to ``url`` (e.g. ``http://localhost:8082``)."""
    root = url.rstrip("/")

    def fetch(path: str, timeout: float) -> Reply:
        try:
            with urllib.request.urlopen(root + path, timeout=timeout) as response:
                return Reply(response.status, json.loads(response.read() or b"{}"))
        except urllib.error.HTTPError as err:
            try:
                body = json.loads(err.read() or b"{}")
            except ValueError:
                body = {}
            return Reply(err.code, body if isinstance(body, dict) else {})
        except (urllib.error.URLError, OSError) as err:
            return Reply(0, {"reason": "Unreachable", "message": str(err)})

    return fetch


def ask(fetch: Fetch, key: str, *, sooner: bool = False) -> dict[str, Any]:
    """The leader's answer on ``namespace/name`` (``sooner``: its counterfactual instead).
    Raises :class:`JobUnknownError` or :class:`NoAnswerError`."""
    namespace, name = key.split("/", 1)
    path = f"/explain/{namespace}/{name}" + ("/sooner" if sooner else "")
    timeout = SOONER_TIMEOUT if sooner else EXPLAIN_TIMEOUT
    last = Reply(0, {})
    for _ in range(ATTEMPTS):
        last = fetch(path, timeout)
        if last.status == 200:
            return last.body
        reason = last.body.get("reason")
        if last.status == 404 and reason == "JobNotFound":
            raise JobUnknownError(str(last.body.get("message")))
        if last.status != 503 or reason not in ("NotLeading", "NoCycleYet"):
            break
    raise NoAnswerError(
        f"{last.status or 'no answer'} {last.body.get('reason', '')}: "
        f"{last.body.get('message', '')}".strip()
    )
