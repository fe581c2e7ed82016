"""The committed CRDs are exactly what the API types generate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
import yaml
from pydantic import BaseModel, Field

from gpusched.api import crdgen

CRD_DIR = Path(__file__).parents[3] / "crds"


def test_committed_crds_match_the_generator() -> None:
    assert crdgen.stale(CRD_DIR) == [], "run `gpusched crds generate` and commit crds/"


def test_stale_reports_a_hand_edited_crd(tmp_path: Path) -> None:
    crdgen.generate(tmp_path)
    path = tmp_path / crdgen.CRDS[0].filename
    path.write_text(path.read_text().replace("gpusPerReplica", "gpus"))
    assert crdgen.stale(tmp_path) == [crdgen.CRDS[0].filename]


def test_every_schema_field_is_documented() -> None:
    undocumented: list[str] = []

    def walk(node: dict, path: str, upstream: bool) -> None:
        for name, sub in node.get("properties", {}).items():
            here = f"{path}.{name}"
            if (
                not upstream
                and not sub.get("description")
                and name not in ("apiVersion", "metadata")
            ):
                undocumented.append(here)
            walk(sub, here, upstream or here.endswith("spec.template"))
        if "items" in node:
            walk(node["items"], path + "[]", upstream)

    for crd in crdgen.CRDS:
        schema = crdgen.crd_manifest(crd)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        walk(schema, crd.kind, upstream=False)
    assert undocumented == []


def test_gpujob_template_embeds_the_upstream_pod_schema() -> None:
    manifest = yaml.safe_load(crdgen.render(crdgen.CRDS[0]).split("\n", 1)[1])
    schema = manifest["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    template = schema["properties"]["spec"]["properties"]["template"]
    containers = template["properties"]["spec"]["properties"]["containers"]
    assert containers["x-kubernetes-list-type"] == "map"
    assert "name" in containers["items"]["required"]
    assert (
        containers["items"]["properties"]["ports"]["items"]["properties"]["protocol"]["default"]
        == "TCP"
    )


def test_names_short_names_and_category_are_set() -> None:
    for crd in crdgen.CRDS:
        names = crdgen.crd_manifest(crd)["spec"]["names"]
        assert names["categories"] == ["gpusched"]
        assert names["shortNames"]
        version = crdgen.crd_manifest(crd)["spec"]["versions"][0]
        if crd.kind == "NetworkTopology":
            # Written by the admin only: no status, so no status subresource.
            assert "subresources" not in version
            assert "status" not in version["schema"]["openAPIV3Schema"]["properties"]
        else:
            assert version["subresources"] == {"status": {}}


def test_committed_field_reference_matches_the_api_types() -> None:
    from gpusched.api import reference

    committed = (CRD_DIR.parent / "docs" / "reference.md").read_text()
    assert committed == reference.render(), "run `gpusched crds generate` and commit docs/"


def test_field_reference_lists_validation_rules_and_defaults() -> None:
    from gpusched.api import reference

    text = reference.render()
    assert "borrowingLimit must be at least guaranteedGpus" in text
    scope_row = "| `spec.topology.scope` | string | one of `nvlink`, `pcie-switch`, `numa`, `node`"
    assert scope_row in text


#: The reasons a CEL validation rule may give (apiextensions.k8s.io/v1 ValidationRule.reason):
#: any other makes the API server refuse the whole CRD.
RULE_REASONS = {
    "FieldValueInvalid",
    "FieldValueForbidden",
    "FieldValueRequired",
    "FieldValueDuplicate",
}


def test_every_validation_rule_gives_a_reason_the_api_server_accepts() -> None:
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations") or []:
                found.append(rule.get("reason", "FieldValueInvalid"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted(CRD_DIR.glob("*.yaml")):
        walk(yaml.safe_load(path.read_text()))
    assert found
    assert set(found) <= RULE_REASONS


def test_a_map_whose_keys_are_constrained_needs_a_rule_that_checks_them() -> None:
    # A structural schema cannot constrain a map's keys: without a CEL rule carrying the
    # check, the API server would accept keys the model refuses.
    lowercase = Annotated[str, Field(pattern=r"^[a-z]+$")]

    class Spec(BaseModel):
        counts: dict[lowercase, int]

    class Unchecked(BaseModel):
        spec: Spec

    with pytest.raises(crdgen.SchemaError, match=r"spec\.counts"):
        crdgen.structural_schema(Unchecked)

    rule = {"rule": "self.all(k, k.matches('^[a-z]+$'))", "message": "lowercase"}

    class CheckedSpec(BaseModel):
        counts: dict[lowercase, int] = Field(json_schema_extra={"x-kubernetes-validations": [rule]})

    class Checked(BaseModel):
        spec: CheckedSpec

    counts = crdgen.structural_schema(Checked)["properties"]["spec"]["properties"]["counts"]
    assert counts["additionalProperties"] == {"type": "integer"}
    assert counts["x-kubernetes-validations"] == [rule]
    assert "patternProperties" not in counts
    assert "propertyNames" not in counts


def test_tenant_quota_columns_tell_jobs_holding_gpus_from_jobs_whose_pods_all_run() -> None:
    # runningJobs counts only jobs whose pods all run; a job admitted with its pods starting is
    # in admittedJobs alone, and `kubectl get tq -o wide` shows both.
    [quota] = [crd for crd in crdgen.CRDS if crd.kind == "TenantQuota"]
    columns = {c["jsonPath"]: c for c in quota.columns}
    assert "admitted" not in columns[".status.runningJobs"]["description"].lower()
    assert columns[".status.admittedJobs"]["name"] == "Admitted"
