"""Free GPUs per kind of request (``Pool.free_gpus``) are counted once until a GPU is held or
freed. After every hold and release the count must be the one the test's own record of which
GPU is free gives, for requests limited to one model and for any model."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.admission.pool import Pool, Request
from tests.unit.core.admission_testdata import job, node

NODES = [node("h0", model="H100"), node("h1", "dgx1", model="H100"), node("a0", model="A100")]
REQUESTS = {
    model: Request.of(job(f"ask/{model}", "t", 1, gpu_model=model)) for model in ("H100", None)
}


def _expected(free: dict[str, set[int]], model: str | None) -> tuple[int, int]:
    counts = [len(free[n.name]) for n in NODES if model is None or n.model == model]
    return sum(counts), max(counts)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_free_gpus_follow_every_hold_and_release(data: Any) -> None:
    pool = Pool(NODES, [])
    free = {n.name: set(range(8)) for n in NODES}
    held: dict[str, tuple[str, set[int]]] = {}
    for step in range(data.draw(st.integers(1, 25))):
        if held and data.draw(st.booleans()):
            key = data.draw(st.sampled_from(sorted(held)))
            where, gpus = held.pop(key)
            pool.release(key)
            free[where] |= gpus
        else:
            where = data.draw(st.sampled_from([n.name for n in NODES]))
            if not free[where]:
                continue
            gpus = set(data.draw(st.sets(st.sampled_from(sorted(free[where])), min_size=1)))
            key = f"j{step}"
            pool.hold(key, where, sorted(gpus))
            held[key] = (where, gpus)
            free[where] -= gpus
        for model, request in REQUESTS.items():
            assert pool.free_gpus(request) == _expected(free, model), (step, model)
