"""Faults the fake NVML can be told to show, from code or from a file a test appends to.

The file holds one JSON object per line, applied in order as lines appear (a running probe's
fake picks them up within a fraction of a second)::

    {"gpu": 3, "xid": 79}                         # an XID event (79: fallen off the bus)
    {"gpu": 1, "ecc": "double-bit"}               # one uncorrectable ECC error, with its event
    {"gpu": 2, "remappedRows": "pending"}         # or "failure", or "none" after a reset
    {"gpu": 0, "throttle": "hw-thermal"}          # "hw-slowdown", "hw-power-brake", "none"
    {"gpu": 4, "lost": true}                      # every query of GPU 4 answers "GPU is lost"
    {"gpu": 5, "temperatureC": 95, "powerW": 640}
    {"nvmlInit": "fail", "error": "DriverNotLoaded"}   # or {"nvmlInit": "ok"}
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

#: Clock-event reason bits per throttle kind (nvmlClocksEventReason*).
THROTTLE_BITS: Final[dict[str, int]] = {
    "none": 0,
    "hw-slowdown": 0x08,
    "hw-thermal": 0x08 | 0x40,
    "hw-power-brake": 0x08 | 0x80,
    "sw-power-cap": 0x04,
}


class FaultError(ValueError):
    """A fault description that cannot be applied (names the line and the problem)."""


class Fault(BaseModel):
    """One fault; exactly one kind per object, ``gpu`` for all but ``nvmlInit``."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    gpu: int | None = Field(None, ge=0)
    xid: int | None = Field(None, ge=0)
    ecc: Literal["double-bit"] | None = None
    remapped_rows: Literal["pending", "failure", "none"] | None = None
    throttle: (
        Literal["none", "hw-slowdown", "hw-thermal", "hw-power-brake", "sw-power-cap"] | None
    ) = None
    lost: bool | None = None
    temperature_c: int | None = None
    power_w: float | None = Field(None, ge=0)
    nvml_init: Literal["fail", "ok"] | None = None
    error: str = "DriverNotLoaded"
    """NVML error of a failing init, by its pynvml class suffix (``NVMLError_<error>``)."""

    @model_validator(mode="after")
    def _one_kind(self) -> Fault:
        kinds = [
            name
            for name in (
                "xid",
                "ecc",
                "remapped_rows",
                "throttle",
                "lost",
                "nvml_init",
            )
            if getattr(self, name) is not None
        ]
        telemetry = self.temperature_c is not None or self.power_w is not None
        if len(kinds) + (1 if telemetry else 0) != 1:
            raise ValueError(
                "give exactly one of xid, ecc, remappedRows, throttle, lost, nvmlInit, "
                "temperatureC/powerW"
            )
        if self.nvml_init is None and self.gpu is None:
            raise ValueError("this fault needs the index of its GPU in 'gpu'")
        return self


def parse_fault(text: str, where: str = "fault") -> Fault:
    """One JSON fault object (raises :class:`FaultError` naming ``where``)."""
    try:
        return Fault.model_validate(json.loads(text))
    except json.JSONDecodeError as err:
        raise FaultError(f"{where}: not JSON: {err.msg}") from err
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'fault'}: {e['msg']}" for e in err.errors()
        )
        raise FaultError(f"{where}: {problems}") from err


class FaultFeed:
    """New faults appended to a file since the last poll (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._line = 0
        self._lock = threading.Lock()

    def poll(self) -> list[Fault]:
        """Faults on lines added since the previous call; a bad line raises FaultError."""
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                return []
            if size <= self._offset:
                return []
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read(size - self._offset)
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._offset += len(complete)
            faults = []
            for raw in complete.decode().splitlines():
                self._line += 1
                if raw.strip() and not raw.lstrip().startswith("#"):
                    faults.append(parse_fault(raw, f"{self.path}:{self._line}"))
            return faults
