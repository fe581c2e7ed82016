"""Run-time prediction: the recent-average rule, its levels, overruns and persistence."""

from __future__ import annotations

import json

import pytest

from gpusched.core.runtime import JobKind, RuntimeHistory, expected_end, family_of


def kind(tenant: str = "t", group: str = "ns", family: str = "bert", gpus: int = 8) -> JobKind:
    return JobKind(tenant=tenant, group=group, family=family, gpus=gpus)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("bert-ft-042", "bert-ft"),
        ("bert-ft-x7k2p", "bert-ft"),
        ("resnet50", "resnet50"),
        ("resnet50-run3", "resnet50"),
        ("sweep-lr-0-001", "sweep-lr"),
        ("train", "train"),
    ],
)
def test_a_jobs_family_drops_run_numbers_and_generated_suffixes(name: str, family: str) -> None:
    assert family_of(name) == family


def test_nothing_is_predicted_before_anything_finished() -> None:
    assert RuntimeHistory().predict(kind()) is None


def test_the_prediction_is_the_mean_of_the_last_two_runs_of_the_same_kind() -> None:
    history = RuntimeHistory()
    for seconds in (100.0, 300.0, 500.0):
        history.record(kind(), seconds)
    found = history.predict(kind())
    assert found is not None
    assert found.seconds == 400.0  # (300 + 500) / 2: the first run has dropped out
    assert found.level == 1


def test_the_most_specific_level_with_history_answers() -> None:
    history = RuntimeHistory()
    history.record(kind(family="bert"), 1000.0)
    history.record(kind(tenant="other", family="x", gpus=1), 10.0)
    # Same tenant, group and size, another family: level 2 (group and size).
    other_family = history.predict(kind(family="gpt"))
    assert other_family is not None
    assert (other_family.seconds, other_family.level) == (1000.0, 2)
    # Same tenant, other group and size: level 4 (tenant).
    other_size = history.predict(kind(group="ns2", gpus=2))
    assert other_size is not None
    assert (other_size.seconds, other_size.level) == (1000.0, 4)
    # Unknown tenant: the whole cluster (both runs).
    unknown = history.predict(kind(tenant="new"))
    assert unknown is not None
    assert (unknown.seconds, unknown.level) == (505.0, 5)


def test_a_declared_limit_caps_the_prediction_and_answers_alone() -> None:
    history = RuntimeHistory()
    history.record(kind(), 7200.0)
    capped = history.predict(kind(), declared=3600.0)
    assert capped is not None
    assert (capped.seconds, capped.level) == (3600.0, 0)
    longer = history.predict(kind(), declared=10_000.0)
    assert longer is not None
    assert longer.seconds == 7200.0
    alone = RuntimeHistory().predict(kind(), declared=600.0)
    assert alone is not None
    assert (alone.seconds, alone.level) == (600.0, 0)


def test_a_job_within_its_prediction_ends_at_start_plus_prediction() -> None:
    assert expected_end(started_at=1000.0, now=1500.0, runtime=3600.0) == 4600.0


def test_a_job_past_its_prediction_is_expected_to_run_as_long_again() -> None:
    # Ran 2 h against a 1 h prediction: expected to end 2 h from now.
    assert expected_end(started_at=0.0, now=7200.0, runtime=3600.0) == 14_400.0
    # Just past it: at least a minute more.
    assert expected_end(started_at=0.0, now=30.0, runtime=10.0) == 90.0


def test_a_declared_limit_bounds_the_expected_end() -> None:
    assert expected_end(started_at=0.0, now=7200.0, runtime=3600.0, declared=9000.0) == 9000.0
    assert expected_end(started_at=0.0, now=100.0, runtime=None, declared=500.0) == 500.0
    assert expected_end(started_at=0.0, now=100.0, runtime=None) is None


def test_the_history_survives_a_round_trip_through_json() -> None:
    history = RuntimeHistory()
    history.record(kind(), 100.0)
    history.record(kind(), 200.0)
    history.record(kind(tenant="b", gpus=1), 50.0)
    loaded = RuntimeHistory.from_json(json.loads(json.dumps(history.to_json())))
    for k in (kind(), kind(tenant="b", gpus=1), kind(tenant="c")):
        assert loaded.predict(k) == history.predict(k)


def test_a_damaged_history_loads_what_parses_and_drops_the_rest() -> None:
    data = {
        "version": 1,
        "recent": [
            [["t", "a"], [100.0]],
            [["t", "b"], ["x", -5, 30.0]],
            ["not a pair"],
            [[1, 2], [10.0]],
        ],
    }
    loaded = RuntimeHistory.from_json(data)
    assert len(loaded) == 2
    assert RuntimeHistory.from_json({"version": 9}).predict(kind()) is None


def test_the_history_forgets_the_least_recently_updated_kinds_first() -> None:
    history = RuntimeHistory(max_keys=6)
    history.record(kind(tenant="a"), 10.0)  # 5 keys
    history.record(kind(tenant="b"), 20.0)  # 4 more, the cluster key shared: 9, 3 dropped
    # Tenant a's three most specific levels were updated longest ago and are gone.
    found = history.predict(kind(tenant="a"))
    assert found is not None
    assert (found.seconds, found.level) == (10.0, 4)
    newest = history.predict(kind(tenant="b"))
    assert newest is not None
    assert newest.level == 1
