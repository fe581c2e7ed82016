"""Cross-object rules checked at apply time (the operator's validating webhook)."""

from __future__ import annotations

import json

from gpusched.api.tenantquota import TenantQuota
from gpusched.core.lifecycle.validation import (
    namespace_claim_refusal,
    priority_class_refusal,
    template_size_refusal,
    tree_refusal,
    unowned_namespace_refusal,
)
from tests.cases.manifests import large_template, tenantquota


def _quota(name: str, *namespaces: str) -> TenantQuota:
    return TenantQuota.model_validate(tenantquota(name, namespaces=list(namespaces)))


def test_a_namespace_another_tenant_owns_is_refused_naming_its_index_and_owner() -> None:
    others = [_quota("vision", "cv", "cv-eval"), _quota("speech", "asr")]
    refusal = namespace_claim_refusal("nlp", ["nlp", "asr"], others)
    assert refusal is not None
    assert refusal.startswith("spec.namespaces[1]:")
    assert "'asr'" in refusal
    assert "'speech'" in refusal


def test_a_tenant_updating_itself_does_not_conflict_with_its_own_namespaces() -> None:
    others = [_quota("vision", "cv"), _quota("speech", "asr")]
    assert namespace_claim_refusal("vision", ["cv", "cv-new"], others) is None


def _created(quota: TenantQuota, when: str) -> TenantQuota:
    raw = quota.model_dump(by_alias=True, mode="json", exclude_none=True)
    raw["metadata"]["creationTimestamp"] = when
    return TenantQuota.model_validate(raw)


def test_a_namespace_listed_twice_stays_with_its_older_tenant_which_stays_editable() -> None:
    """A newer TenantQuota listed ``ml`` while the webhook was down: the older one owns it (as
    admission counts it) and may still be changed; the newer one is told the owner."""
    older = _created(_quota("research", "ml"), "2026-01-01T00:00:00Z")
    newer = _created(_quota("intruder", "ml"), "2026-02-01T00:00:00Z")
    stored = [newer, older]
    assert namespace_claim_refusal("research", ["ml", "ml-eval"], stored) is None
    refusal = namespace_claim_refusal("intruder", ["ml"], stored)
    assert refusal is not None
    assert "'research'" in refusal


def test_fresh_namespaces_are_accepted() -> None:
    assert namespace_claim_refusal("nlp", ["nlp"], [_quota("vision", "cv")]) is None


def test_a_job_in_a_namespace_no_tenant_owns_is_refused_naming_the_namespace() -> None:
    refusal = unowned_namespace_refusal("scratch", [_quota("vision", "cv")])
    assert refusal is not None
    assert refusal.startswith("metadata.namespace:")
    assert "'scratch'" in refusal
    assert unowned_namespace_refusal("cv", [_quota("vision", "cv")]) is None


def test_a_missing_priority_class_is_refused_and_no_class_is_fine() -> None:
    refusal = priority_class_refusal("urgent", {"low", "high"})
    assert refusal is not None
    assert refusal.startswith("spec.priorityClassName:")
    assert priority_class_refusal("high", {"low", "high"}) is None
    assert priority_class_refusal(None, set()) is None


def _tq(name: str, guaranteed: int = 0, parent: str | None = None, *ns: str) -> TenantQuota:
    spec: dict[str, object] = {"guaranteedGpus": guaranteed, "namespaces": list(ns)}
    if parent:
        spec["parent"] = parent
    return TenantQuota.model_validate(tenantquota(name, **spec))


def test_a_tenant_tree_refuses_cycles_naming_the_parent() -> None:
    others = [_tq("org"), _tq("team", 0, "org")]
    assert tree_refusal("org", "org", 0, [], others) is not None
    refusal = tree_refusal("org", "team", 0, [], others)
    assert refusal is not None
    assert refusal.startswith("spec.parent:")
    assert "cycle" in refusal


def test_a_tenant_tree_refuses_children_guaranteed_more_than_their_parent() -> None:
    others = [_tq("org", 16), _tq("a", 10, "org", "a")]
    refusal = tree_refusal("b", "org", 8, ["b"], others)
    assert refusal is not None
    assert "guaranteed 18 GPUs together, more than its own 16" in refusal
    assert tree_refusal("b", "org", 6, ["b"], others) is None
    # Lowering the parent below its children's guarantees is refused too.
    shrunk = tree_refusal("org", None, 8, [], [_tq("a", 10, "org", "a")])
    assert shrunk is not None
    assert shrunk.startswith("spec.guaranteedGpus:")


def test_a_parent_lists_no_namespaces_and_a_missing_parent_is_accepted() -> None:
    refusal = tree_refusal("org", None, 8, ["ml"], [_tq("a", 4, "org", "a")])
    assert refusal is not None
    assert refusal.startswith("spec.namespaces:")
    assert tree_refusal("a", "not-yet", 4, ["a"], []) is None


def test_a_child_is_refused_under_a_tenant_that_lists_namespaces() -> None:
    """Applied after its parent, the child would take the parent's namespaces' tenant away."""
    refusal = tree_refusal("vision", "research", 4, ["cv"], [_tq("research", 8, None, "ml")])
    assert refusal is not None
    assert refusal.startswith("spec.parent:")
    assert "'research' lists namespaces (ml)" in refusal
    assert tree_refusal("vision", "research", 4, ["cv"], [_tq("research", 8)]) is None


def _template_of_bytes(size: int) -> dict[str, object]:
    """A pod template whose compact JSON is exactly ``size`` bytes (measured independently)."""

    def with_arg(arg: str) -> dict[str, object]:
        return {"spec": {"containers": [{"name": "c", "image": "i", "args": [arg]}]}}

    base = len(json.dumps(with_arg(""), separators=(",", ":")))
    template = with_arg("x" * (size - base))
    assert len(json.dumps(template, separators=(",", ":"))) == size
    return template


def test_a_pod_template_over_the_byte_limit_is_refused_naming_the_template() -> None:
    assert template_size_refusal(_template_of_bytes(256 * 1024)) is None
    refusal = template_size_refusal(_template_of_bytes(256 * 1024 + 1))
    assert refusal is not None
    assert refusal.startswith("spec.template: 262145 bytes of JSON, over the 262144")


def test_a_large_real_pod_template_is_within_the_byte_limit() -> None:
    assert template_size_refusal(large_template()) is None
