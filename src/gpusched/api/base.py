"""Shared pydantic configuration for every API type.

Kubernetes speaks camelCase JSON while Python code reads best in snake_case; one config keeps
the two consistent for every type, turns attribute docstrings into schema descriptions (so the
CRDs and ``kubectl explain`` carry the same documentation as the code), and refuses unknown
fields the way the API server does under strict field validation.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every gpusched API type."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="forbid",
        validate_assignment=True,
    )

    def to_k8s(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase keys, unset optionals omitted."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class LenientApiModel(ApiModel):
    """A type read back from the API server, where newer servers may add fields we ignore."""

    model_config = ConfigDict(extra="ignore")


#: A Kubernetes label value, non-empty: what a GPU model is named by (the
#: ``nvidia.com/gpu.product`` node label), so a name no node could carry is refused at apply time.
LABEL_VALUE_PATTERN: Final = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
GpuModel = Annotated[str, Field(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)]
