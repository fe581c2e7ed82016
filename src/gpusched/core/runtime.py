"""How long a job will run, from how long jobs like it ran.

Reservations and backfill need run times, and users of a Kubernetes cluster do not declare
them (a GpuJob's ``maxRuntimeSeconds`` is optional). Tsafrir, Etsion and Feitelson ("Backfilling
using system-generated predictions rather than user runtime estimates", IEEE TPDS 2007) showed
that the mean run time of the same user's last two jobs predicts better than users' own
estimates, and that backfill with it performs as well as with perfect knowledge. The same rule
here, over what a cluster knows of a job: its tenant, the group that submitted it (namespace,
or the submitter where known), its *family* (the job's name without the numbers and random
suffixes generated names carry, or a label the user sets), and its size. The most specific
level with history answers:

1. same tenant, group, family and GPU count;
2. same tenant, group and GPU count;
3. same tenant and GPU count;
4. same tenant;
5. the whole cluster.

Wrong predictions correct themselves: each finished run replaces the oldest of the two at every
level. A running job that outlives its prediction is expected to run as long again as it has run
so far (:func:`expected_end`): GPU job run times are heavy-tailed, and for such distributions
the expected remaining life grows with age (Harchol-Balter and Downey, 1997). A declared
``maxRuntimeSeconds`` (enforced: the job fails at it) caps every prediction.

The history is a small mutable table owned by the caller (the operator persists it, the
simulator keeps it for the replay); predictions are pure reads of it.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

#: Finished runs averaged per key (Tsafrir et al.: the last two).
RECENT: Final = 2
#: Keys kept (least recently updated dropped first): bounds memory and the persisted size.
DEFAULT_MAX_KEYS: Final = 4096
#: Shortest run time recorded or predicted (seconds): a job is at least this long.
MIN_RUNTIME: Final = 1.0

_SUFFIX = re.compile(r"[0-9]")

Key = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobKind:
    """What makes two jobs alike for prediction."""

    tenant: str
    group: str
    """Who submitted it: the namespace, or the submitter where known."""
    family: str
    """The job's name without its generated parts (:func:`family_of`), or a label's value."""
    gpus: int
    """GPUs of the whole job."""

    def levels(self) -> tuple[Key, ...]:
        """The levels, most specific first."""
        gpus = str(self.gpus)
        return (
            ("f", self.tenant, self.group, self.family, gpus),
            ("g", self.tenant, self.group, gpus),
            ("s", self.tenant, gpus),
            ("t", self.tenant),
            ("c",),
        )


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted run time and how specific the history behind it is."""

    seconds: float
    level: int
    """1 (same family) .. 5 (whole cluster), 0 when a declared limit decided it."""


def family_of(name: str) -> str:
    """The part of a job's name that stays the same from run to run.

    Trailing dash-separated parts holding a digit (run numbers, dates, the random suffix of
    ``generateName``) are dropped; the first part always stays: ``bert-ft-042`` and
    ``bert-ft-x7k2p`` are ``bert-ft``, ``resnet50`` stays ``resnet50``.
    """
    parts = name.split("-")
    while len(parts) > 1 and _SUFFIX.search(parts[-1]):
        parts.pop()
    return "-".join(parts)


class RuntimeHistory:
    """The last :data:`RECENT` run times per kind of job, at every level."""

    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        self._recent: OrderedDict[Key, tuple[float, ...]] = OrderedDict()
        self.records = 0
        """Finished runs recorded since this history was created or loaded."""

    def __len__(self) -> int:
        return len(self._recent)

    def record(self, kind: JobKind, seconds: float) -> None:
        """A job of ``kind`` finished after running ``seconds``."""
        if not math.isfinite(seconds):
            return
        value = max(MIN_RUNTIME, seconds)
        for key in kind.levels():
            runs = self._recent.pop(key, ())
            self._recent[key] = (*runs, value)[-RECENT:]
        while len(self._recent) > self.max_keys:
            self._recent.popitem(last=False)
        self.records += 1

    def predict(self, kind: JobKind, declared: float | None = None) -> Prediction | None:
        """The run time of a job of ``kind`` (None: nothing is known yet); never above
        ``declared`` (the job's enforced limit)."""
        for level, key in enumerate(kind.levels(), start=1):
            runs = self._recent.get(key)
            if runs:
                seconds = sum(runs) / len(runs)
                if declared is not None and declared < seconds:
                    return Prediction(declared, 0)
                return Prediction(seconds, level)
        if declared is not None:
            return Prediction(max(MIN_RUNTIME, declared), 0)
        return None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (oldest first, so loading keeps the eviction order)."""
        return {
            "version": 1,
            "recent": [[list(key), list(runs)] for key, runs in self._recent.items()],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], max_keys: int = DEFAULT_MAX_KEYS) -> RuntimeHistory:
        """Load :meth:`to_json`'s form; entries that do not parse are skipped (a damaged
        record costs its predictions, not the operator's start)."""
        history = cls(max_keys)
        if not isinstance(data, Mapping) or data.get("version") != 1:
            return history
        entries = data.get("recent")
        if not isinstance(entries, list):
            return history
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) == 2):
                continue
            key, runs = entry
            if not (isinstance(key, list) and all(isinstance(k, str) for k in key) and key):
                continue
            if not isinstance(runs, list):
                continue
            values = tuple(
                float(v)
                for v in runs
                if isinstance(v, int | float) and math.isfinite(v) and v >= MIN_RUNTIME
            )[-RECENT:]
            if values:
                history._recent[tuple(key)] = values
        while len(history._recent) > max_keys:
            history._recent.popitem(last=False)
        return history


def expected_end(
    started_at: float, now: float, runtime: float | None, declared: float | None = None
) -> float | None:
    """When a job that started at ``started_at`` is expected to end, seen at ``now``.

    Within its prediction: start plus the prediction. Past it: as long again as it has run (at
    least a minute more), never past its declared limit. None when nothing is known.
    """
    limit = started_at + declared if declared is not None else math.inf
    if runtime is None:
        return limit if math.isfinite(limit) else None
    end = started_at + runtime
    if end <= now:
        end = now + max(60.0, now - started_at)
    return min(end, max(limit, now))
