"""Which jobs share a dry-run verdict on their pod."""

from __future__ import annotations

from typing import Any

from gpusched.api.gpujob import GpuJob
from gpusched.operator.templates import dry_run_manifest, template_key


def _job(name: str, namespace: str = "ns", labels: dict[str, str] | None = None) -> GpuJob:
    template: dict[str, Any] = {"spec": {"containers": [{"name": "main", "image": "img"}]}}
    if labels is not None:
        template["metadata"] = {"labels": labels}
    return GpuJob.model_validate(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"gpusPerReplica": 1, "template": template},
        }
    )


def _key(job: GpuJob, tenant: str = "t") -> str:
    return template_key(dry_run_manifest(job, tenant))


def test_jobs_of_one_template_share_a_verdict() -> None:
    assert _key(_job("sweep-1")) == _key(_job("sweep-2"))


def test_template_metadata_spec_namespace_and_tenant_each_make_another_pod() -> None:
    base = _key(_job("a"))
    assert _key(_job("b", labels={"team": "bad value!"})) != base
    assert _key(_job("b", namespace="other")) != base
    assert _key(_job("b"), tenant="other") != base
    other_spec = _job("b").model_copy(deep=True)
    other_spec.spec.template["spec"]["restartPolicy"] = "Sometimes"
    assert _key(other_spec) != base
