"""``explain`` reads the last cycle's decision while the next cycle decides on the other kept
pool: a reader never waits for a cycle, and never reads a pool a later cycle took back."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from gpusched.operator.decide import Decision, Memo
from gpusched.operator.loop import AdmissionLoop
from gpusched.operator.store import Store


@dataclass
class Decided:
    """Stands for a Decision: the loop reads only which pool it used."""

    pool: int


def _loop() -> AdmissionLoop:
    return AdmissionLoop(cast(Any, None), Store())


def _decided(loop: AdmissionLoop, pool: int) -> Decision:
    decision = cast(Decision, Decided(pool))
    loop._pool_owner[pool] = loop.last = decision
    return decision


def test_the_memo_gives_cycles_its_two_pools_in_turn() -> None:
    memo = Memo()
    first, second, third = memo.next_pool(), memo.next_pool(), memo.next_pool()
    assert (first[0], second[0], third[0]) == (0, 1, 0)
    assert first[1] is third[1]
    assert first[1] is not second[1]


def test_a_reader_is_answered_while_the_next_cycle_decides_on_the_other_pool() -> None:
    async def scenario() -> Decision | None:
        loop = _loop()
        last = _decided(loop, 0)
        async with loop._pool_locks[1]:  # the next cycle, deciding
            async with asyncio.timeout(1):
                async with loop.last_decision() as decision:
                    assert decision is last
                    return decision

    assert asyncio.run(scenario()) is not None


def test_a_reader_of_a_pool_a_later_cycle_took_back_reads_the_newer_decision() -> None:
    async def scenario() -> tuple[Decision | None, Decision]:
        loop = _loop()
        stale = _decided(loop, 0)
        lock = loop._pool_locks[0]
        await lock.acquire()  # the cycle after next takes pool 0 back ...
        reader = asyncio.create_task(_read(loop))
        await asyncio.sleep(0.01)
        newer = _decided(loop, 0)  # ... and decides on it
        assert loop.last is not stale
        lock.release()
        return await reader, newer

    async def _read(loop: AdmissionLoop) -> Decision | None:
        async with loop.last_decision() as decision:
            return decision

    read, newer = asyncio.run(scenario())
    assert read is newer


def test_a_replica_that_does_not_lead_has_no_decision_to_answer_from() -> None:
    async def scenario() -> Decision | None:
        loop = _loop()
        async with loop.last_decision() as decision:
            return decision

    assert asyncio.run(scenario()) is None
