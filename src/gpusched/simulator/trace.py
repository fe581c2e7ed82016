"""The generic job-trace format: one job per JSON line (``.jsonl``) or CSV row (``.csv``).

Fields (docs/simulator.md): ``id``, ``submit`` (seconds after the trace's start), ``duration``
(seconds on a well-wired set), ``replicas``, ``gpus_per_replica``, ``tenant``, and optionally
``priority`` (0), ``gpu_model`` (any), ``scope`` (``node``), ``mode`` (``preferred``),
``preemptible`` (true), ``measured_on`` (the worst link its duration was measured on, e.g.
``network``; empty: a well-wired set). Any trace converted to this format replays; a bad row
is refused with its file, line and field, and nothing is replayed.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpusched.api.gpujob import TopologyMode, TopologyScope
from gpusched.simulator.model import Link, TraceJob

FIELDS = (
    "id",
    "submit",
    "duration",
    "replicas",
    "gpus_per_replica",
    "tenant",
    "priority",
    "gpu_model",
    "scope",
    "mode",
    "preemptible",
    "measured_on",
)


class TraceError(ValueError):
    """A trace file that cannot be replayed, with where and why."""


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    submit: float = Field(ge=0, allow_inf_nan=False)
    duration: float = Field(gt=0, allow_inf_nan=False)
    replicas: int = Field(ge=1)
    gpus_per_replica: int = Field(ge=1)
    tenant: str = Field(min_length=1)
    priority: int = 0
    gpu_model: str | None = None
    scope: TopologyScope = TopologyScope.NODE
    mode: TopologyMode = TopologyMode.PREFERRED
    preemptible: bool = True
    measured_on: Link | None = None

    @field_validator("gpu_model", "measured_on", mode="before")
    @classmethod
    def _empty_is_any(cls, value: Any) -> Any:
        return None if value == "" else value

    def job(self) -> TraceJob:
        return TraceJob(
            id=self.id,
            submit=self.submit,
            duration=self.duration,
            replicas=self.replicas,
            gpus_per_replica=self.gpus_per_replica,
            tenant=self.tenant,
            priority=self.priority,
            gpu_model=self.gpu_model,
            scope=self.scope,
            mode=self.mode,
            preemptible=self.preemptible,
            measured_on=self.measured_on,
        )


#: Longest line a trace may have: a job is a few hundred bytes, so a longer line is not a job
#: (and reading it whole would take memory in proportion).
MAX_LINE_BYTES = 64 * 1024


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """The file's lines, numbered from 1, each read with a bounded buffer and decoded as UTF-8;
    a line too long or not UTF-8 is refused with its file, line (and column)."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    with handle:
        number = 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(
                    f"{path}:{number}: line longer than {MAX_LINE_BYTES} bytes; not a job"
                )
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(
                    f"{path}:{number}:{exc.start + 1}: not UTF-8 text (byte 0x{raw[exc.start]:02x})"
                ) from None


def _no_constants(token: str) -> Any:
    raise ValueError(f"{token} is not a number a trace may hold")


def _rows(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    if path.suffix == ".jsonl":
        for number, line in _lines(path):
            if not line.strip():
                continue
            try:
                value = json.loads(line, parse_constant=_no_constants)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{number}: not JSON ({exc.msg})") from None
            except ValueError as exc:
                raise TraceError(f"{path}:{number}: {exc}") from None
            if not isinstance(value, dict):
                raise TraceError(f"{path}:{number}: expected an object, got {value!r}")
            yield number, value
    elif path.suffix == ".csv":
        numbered = _lines(path)
        current = [0]

        def text() -> Iterator[str]:
            for number, line in numbered:
                current[0] = number
                yield line

        reader = csv.DictReader(text())
        try:
            for row in reader:
                yield current[0], {k: v for k, v in row.items() if v not in (None, "")}
        except csv.Error as exc:
            raise TraceError(f"{path}:{current[0]}: not CSV ({exc})") from None
    else:
        raise TraceError(f"{path}: unknown trace format {path.suffix!r}; use .jsonl or .csv")


def read_trace(path: Path) -> tuple[TraceJob, ...]:
    """Every job of a trace file, by submission time (then id)."""
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    for number, row in _rows(path):
        try:
            job = _Row.model_validate(row).job()
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "row"
            raise TraceError(f"{path}:{number}: field {where}: {first['msg']}") from None
        if job.id in seen:
            raise TraceError(f"{path}:{number}: id {job.id!r} already used on line {seen[job.id]}")
        seen[job.id] = number
        jobs.append(job)
    return tuple(sorted(jobs, key=lambda j: (j.submit, j.id)))


def _record(job: TraceJob) -> dict[str, Any]:
    return {
        "id": job.id,
        "submit": job.submit,
        "duration": job.duration,
        "replicas": job.replicas,
        "gpus_per_replica": job.gpus_per_replica,
        "tenant": job.tenant,
        "priority": job.priority,
        "gpu_model": job.gpu_model,
        "scope": job.scope.value,
        "mode": job.mode.value,
        "preemptible": job.preemptible,
        "measured_on": job.measured_on.value if job.measured_on else None,
    }


def write_trace(jobs: Iterable[TraceJob], path: Path) -> None:
    """Write jobs in the generic format (by the file's extension)."""
    records = [_record(j) for j in jobs]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            for r in records:
                writer.writerow({k: _csv_value(v) for k, v in r.items()})
    else:
        raise TraceError(f"{path}: unknown trace format {path.suffix!r}; use .jsonl or .csv")


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value
