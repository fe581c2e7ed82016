"""The chart's admission policies name exactly the keys gpusched's code reads as gpusched's own."""

from __future__ import annotations

import re
from typing import Any

from gpusched.api import keys
from gpusched.dev.chart import render


def _policy_variable(objects: list[dict[str, Any]], suffix: str, variable: str) -> list[str]:
    """The quoted strings of the CEL list ``variable`` of the policy named ``*-suffix``."""
    policy = next(
        obj
        for obj in objects
        if obj["kind"] == "ValidatingAdmissionPolicy" and obj["metadata"]["name"].endswith(suffix)
    )
    expression = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == variable)
    return re.findall(r"'([^']*)'", expression)


def test_the_policies_protect_exactly_the_annotations_and_labels_gpusched_owns() -> None:
    objects = render.identity("access")
    assert _policy_variable(objects, "-pod-gpu-ownership", "owned") == list(
        keys.OWNERSHIP_ANNOTATIONS
    )
    assert _policy_variable(objects, "-gpujob-pod-identity", "keys") == list(keys.GPUJOB_POD_LABELS)
    assert _policy_variable(objects, "-gpujob-pod-claims", "keys") == list(keys.GPUJOB_POD_LABELS)
