"""``gpusched explain`` asks the leading operator: a standby's 503 is asked again (the Service
picks a replica per request), anything else ends the asking at once."""

from __future__ import annotations

from typing import Any

import pytest

from gpusched.operator import asking
from gpusched.operator.asking import Reply


class Replicas:
    """Replies in turn, recording the paths asked."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.asked: list[str] = []

    def __call__(self, path: str, timeout: float) -> Reply:
        self.asked.append(path)
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


STANDBY = Reply(503, {"reason": "NotLeading", "message": "ask the leader", "leader": "op-0"})
LEADER: dict[str, Any] = {"explanation": {"job": "ns/j"}, "decidedAt": "2026-11-27T00:00:00Z"}


def test_a_standby_is_asked_again_until_the_leader_answers() -> None:
    replicas = Replicas(STANDBY, STANDBY, Reply(200, LEADER))
    assert asking.ask(replicas, "ns/j") == LEADER
    assert replicas.asked == ["/explain/ns/j"] * 3


def test_the_counterfactual_is_asked_at_its_own_path() -> None:
    replicas = Replicas(Reply(200, {"counterfactual": None}))
    asking.ask(replicas, "ns/j", sooner=True)
    assert replicas.asked == ["/explain/ns/j/sooner"]


def test_no_leader_after_every_attempt_is_no_answer() -> None:
    replicas = Replicas(STANDBY)
    with pytest.raises(asking.NoAnswerError, match="NotLeading"):
        asking.ask(replicas, "ns/j")
    assert len(replicas.asked) == asking.ATTEMPTS


@pytest.mark.parametrize(
    "reply",
    [
        Reply(403, {"reason": "Forbidden", "message": "services/proxy is forbidden"}),
        Reply(503, {"reason": "ServiceUnavailable", "message": "no endpoints available"}),
        Reply(404, {"reason": "NotFound", "message": 'services "gpusched-operator" not found'}),
        Reply(0, {"reason": "Unreachable", "message": "connection refused"}),
    ],
)
def test_a_refusal_or_a_missing_operator_is_not_asked_again(reply: Reply) -> None:
    replicas = Replicas(reply)
    with pytest.raises(asking.NoAnswerError, match=str(reply.body["reason"])):
        asking.ask(replicas, "ns/j")
    assert len(replicas.asked) == 1


def test_a_job_the_leader_does_not_know_is_said_so() -> None:
    replicas = Replicas(Reply(404, {"reason": "JobNotFound", "message": "GpuJob ns/j not found"}))
    with pytest.raises(asking.JobUnknownError, match="GpuJob ns/j not found"):
        asking.ask(replicas, "ns/j")


def test_an_operator_url_without_a_scheme_is_refused_naming_the_option() -> None:
    from click.testing import CliRunner

    from gpusched.cli import main

    result = CliRunner().invoke(main, ["explain", "ns/j", "--operator", "localhost:8082"])
    assert result.exit_code == 2
    assert "--operator" in result.output
    assert "expected an http:// or https:// URL" in result.output
