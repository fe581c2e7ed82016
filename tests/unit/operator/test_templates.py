"""Which jobs share a dry-run verdict on their pod."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpusched.api.gpujob import GpuJob
from gpusched.core.lifecycle import Verdict
from gpusched.operator import templates
from gpusched.operator.templates import TemplateChecker, dry_run_manifest, template_key


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


def test_a_jobs_template_key_is_worked_out_once_while_the_job_and_its_tenant_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """New jobs are checked in every cycle until their first status is written: the key of
    each is kept, and worked out again when the job object or its tenant changes."""
    made: list[str] = []

    def counted(job: GpuJob, tenant: str | None) -> dict[str, Any]:
        made.append(job.metadata.name)
        return dry_run_manifest(job, tenant)

    monkeypatch.setattr(templates, "dry_run_manifest", counted)
    # Every verdict the test asks for is known, so no dry run (no API call) is ever made.
    checker = TemplateChecker(api=None)  # type: ignore[arg-type]
    verdict = Verdict(None)
    a, b = _job("a"), _job("b")
    for job, tenant in ((a, "t"), (b, "t"), (b, "other")):
        checker._verdicts[_key(job, tenant)] = (checker.clock(), verdict)
    jobs = [("ns/a", a, "t"), ("ns/b", b, "t")]
    assert asyncio.run(checker.verdicts(jobs)) == {"ns/a": verdict, "ns/b": verdict}
    assert made == ["a", "b"]
    asyncio.run(checker.verdicts(jobs))
    assert made == ["a", "b"]
    changed = a.model_copy()
    asyncio.run(checker.verdicts([("ns/a", changed, "t"), ("ns/b", b, "other")]))
    assert made == ["a", "b", "a", "b"]
