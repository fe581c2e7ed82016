"""``gpusched explain`` refuses a bad name and reports an unreadable kubeconfig or an API server
that does not answer with one ``Error:`` line and a non-zero exit, never a traceback.

No cluster: the kubeconfigs point at a closed port on the loopback, and the failures further
in are raised by a stand-in for the question to the operator."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner, Result

from gpusched.cli import main

CLOSED = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


@pytest.fixture(autouse=True)
def no_ambient_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No kubeconfig but the test's own: an empty home, no $KUBECONFIG, not in a pod."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def _explain(*args: str) -> Result:
    return CliRunner().invoke(main, ["explain", *args])


def _refused_in_one_line(result: Result, code: int, *said: str) -> None:
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    for words in said:
        assert words in error, error


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["pod/"], "is not a pod name"),
        (["pod/ns/"], "is not a pod name"),
        (["ns/"], "is not a GpuJob name"),
        (["../x"], "'..' is not a namespace"),
        (["ns/a/b"], "'a/b' is not a GpuJob name"),
        (["Job_1"], "is not a GpuJob name"),
        (["-n", "", "job"], "'' is not a namespace"),
        (["-n", "Team A", "job"], "is not a namespace"),
        (["x" * 254], "at most 253"),
    ],
)
def test_a_name_kubernetes_would_not_accept_is_a_bad_parameter(
    tmp_path: Path, args: list[str], said: str
) -> None:
    """Refused before anything is read: the names go into API paths."""
    config = tmp_path / "closed.kubeconfig"
    config.write_text(CLOSED)
    _refused_in_one_line(_explain(*args, "--kubeconfig", str(config)), 2, said)


def test_no_kubeconfig_is_one_error_line(tmp_path: Path) -> None:
    _refused_in_one_line(_explain("ns/job"), 1, "cannot read the Kubernetes configuration")
    missing = tmp_path / "missing.kubeconfig"
    _refused_in_one_line(
        _explain("ns/job", "--kubeconfig", str(missing)),
        1,
        "cannot read the Kubernetes configuration",
        str(missing),
    )


@pytest.mark.parametrize(
    "text",
    [
        "clusters: [\n",
        "just a string\n",
        "- a\n- list\n",
        "apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n",
    ],
    ids=["broken-yaml", "not-a-mapping", "a-list", "no-such-context"],
)
def test_a_bad_kubeconfig_is_one_error_line(tmp_path: Path, text: str) -> None:
    config = tmp_path / "bad.kubeconfig"
    config.write_text(text)
    _refused_in_one_line(
        _explain("ns/job", "--kubeconfig", str(config)),
        1,
        "cannot read the Kubernetes configuration",
    )


@pytest.mark.parametrize("local", [False, True], ids=["through-the-operator", "local"])
def test_an_api_server_that_refuses_connections_is_one_error_line(
    tmp_path: Path, local: bool
) -> None:
    config = tmp_path / "closed.kubeconfig"
    config.write_text(CLOSED)
    args = ["ns/job", "--kubeconfig", str(config), *(["--local"] if local else [])]
    _refused_in_one_line(
        _explain(*args), 1, "gpujob ns/job:", "the API server at https://127.0.0.1:1 did not answer"
    )


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (aiohttp.ServerDisconnectedError(), "did not answer"),
        (TimeoutError(), "did not answer: TimeoutError"),
        (ConnectionResetError(104, "Connection reset by peer"), "Connection reset by peer"),
        (ValueError("Expecting value: line 1 column 1 (char 0)"), "could not be read"),
    ],
)
def test_a_failure_talking_to_the_cluster_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, said: str
) -> None:
    from gpusched.operator import asking

    def fails(*_args: object, **_kwargs: object) -> object:
        raise error

    monkeypatch.setattr(asking, "ask", fails)
    config = tmp_path / "closed.kubeconfig"
    config.write_text(CLOSED)
    result = _explain("ns/job", "--kubeconfig", str(config))
    _refused_in_one_line(result, 1, "gpujob ns/job:", said)
