"""The operator's webhook refuses a GpuJob whose pod template is over the byte limit, and lets
an update that leaves an existing job's template alone through."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import kopf
import pytest

from gpusched.api.gpujob import MAX_TEMPLATE_BYTES
from gpusched.metrics import OperatorMetrics
from gpusched.operator.store import Store
from gpusched.operator.webhooks import Validator
from tests.cases.manifests import gpujob


def _oversized(name: str) -> dict[str, Any]:
    job = gpujob(name)
    job["metadata"]["namespace"] = "team"
    job["spec"]["template"]["spec"]["containers"][0]["args"] = ["x" * MAX_TEMPLATE_BYTES]
    return job


def _validator() -> Validator:
    # No API server: every check that would read one refuses to (none should be reached).
    return Validator(Store(), cast(Any, None), OperatorMetrics())


def test_creating_a_job_with_an_oversized_template_is_refused_naming_the_template() -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        asyncio.run(_validator().gpujob(_oversized("big"), None))
    assert str(refused.value).startswith("spec.template: ")


def test_an_update_that_keeps_an_oversized_template_is_let_through() -> None:
    # A job stored before the limit (or while the webhook was down): the operator's own
    # writes to it, and its owner's edits of other fields, must pass.
    old = _oversized("big")
    new = _oversized("big")
    new["metadata"]["annotations"] = {"gpusched.io/last-checkpoint": "2026-01-01T00:00:00Z"}
    asyncio.run(_validator().gpujob(new, old))


def test_an_update_that_grows_the_template_over_the_limit_is_refused() -> None:
    old = gpujob("big")
    old["metadata"]["namespace"] = "team"
    with pytest.raises(kopf.AdmissionError):
        asyncio.run(_validator().gpujob(_oversized("big"), old))
