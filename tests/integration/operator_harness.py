"""Running the operator as a real process against the local cluster, and small helpers to
submit jobs and wait for what the operator writes."""

from __future__ import annotations

import itertools
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from gpusched.api import keys
from gpusched.dev.localcluster import LocalCluster, identities
from gpusched.dev.localcluster.components import gpusched_command
from gpusched.dev.localcluster.processes import ProcessRecord, free_port, is_running
from gpusched.dev.localcluster.topologies import fixture_objects

G, V = keys.GROUP, keys.VERSION
#: Label on every node of these tests; the operator only uses nodes carrying it.
POOL_LABEL = "gpusched.io/test-pool"
POOL = "operator"
H100 = "NVIDIA-H100-80GB-HBM3"
_ids = itertools.count()

T = TypeVar("T")


@dataclass
class OperatorCounts:
    """What the operator's /metrics say it has done: requests by (verb, resource), cycles."""

    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    cycles: int = 0

    def since(self, before: OperatorCounts) -> dict[tuple[str, str], int]:
        """Requests made after ``before`` was read, by (verb, resource)."""
        return {
            key: n - before.requests.get(key, 0)
            for key, n in self.requests.items()
            if n > before.requests.get(key, 0)
        }


class OperatorProcess:
    """``gpusched operator`` under the chart's operator identity."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.kubeconfig = identities.kubeconfig(cluster, identities.OPERATOR)
        self.record: ProcessRecord | None = None
        self.starts = 0
        self.metrics_port = 0
        self.health_port = 0
        self.explain_port = 0
        self.args: list[str] = []
        """The arguments of ``gpusched operator`` it runs with."""

    def start(
        self,
        failpoints: str = "",
        *,
        pods_ready_timeout: float = 30,
        backoff_base: float = 1,
        extra: Sequence[str] = (),
    ) -> None:
        env = {**os.environ}
        env.pop("GPUSCHED_FAILPOINTS", None)
        if failpoints:
            env["GPUSCHED_FAILPOINTS"] = failpoints
        self.starts += 1
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.explain_port = free_port()
        self.args = [
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-port={self.metrics_port}",
            f"--health-port={self.health_port}",
            f"--explain-port={self.explain_port}",
            "--resync=1",
            # Each test's operator predicts from what it saw itself, not from the run times
            # of earlier tests' jobs on the same cluster (tests of the history pass a name).
            "--runtime-history=",
            f"--pods-ready-timeout={pods_ready_timeout}",
            "--reservations-per-tenant=1",
            f"--backoff-base={backoff_base}",
            f"--node-selector={POOL_LABEL}={POOL}",
            *extra,  # last: a test's own settings win
        ]
        self.record = self.cluster.spawn(
            f"gpusched-operator-{self.starts}",
            [*gpusched_command(), "operator", *self.args],
            env=env,
        )

    def health(self) -> tuple[int, str]:
        """kopf's liveness endpoint: the HTTP status and body (0 while it does not listen)."""
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except urllib.error.URLError as err:  # not listening yet
            return 0, str(err)

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Every sample of one metric of the operator's /metrics: (labels, value)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return [
            (sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def total(self, name: str, **labels: str) -> float:
        """The sum of one metric's samples whose labels include ``labels``."""
        return sum(
            value
            for found, value in self.samples(name)
            if all(found.get(k) == v for k, v in labels.items())
        )

    def gauge(self, name: str, label: str) -> dict[str, float]:
        """One gauge of the operator's /metrics, by the value of its one label."""
        return {labels[label]: value for labels, value in self.samples(name)}

    def metrics(self) -> OperatorCounts:
        """The operator's request counts and cycles so far, from its /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        counts = OperatorCounts()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if sample.name == "gpusched_operator_api_requests_total":
                    key = (labels["verb"], labels["resource"])
                    counts.requests[key] = counts.requests.get(key, 0) + int(sample.value)
                elif (
                    sample.name == "gpusched_admission_cycle_duration_seconds_count"
                    and labels.get("stage") == "cycle"
                ):
                    counts.cycles = int(sample.value)
        return counts

    def running(self) -> bool:
        return self.record is not None and is_running(self.record)

    def kill(self) -> None:
        """SIGKILL, like a crash."""
        if self.record is not None:
            if is_running(self.record):
                os.killpg(self.record.pid, signal.SIGKILL)
            self.cluster.stop_process(self.record)
            self.record = None

    def wait_exit(self, timeout: float = 60) -> None:
        """Wait for the process to exit by itself (a failpoint)."""
        assert self.record is not None
        wait_for(lambda: not is_running(self.record) or None, timeout, "operator to exit")  # type: ignore[arg-type]
        self.cluster.stop_process(self.record)
        self.record = None

    def log(self) -> str:
        if self.record is None:
            return ""
        return Path(self.record.log).read_text(errors="replace")[-5000:]


def wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``check`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def job_template(*, runtime: str = "1h", labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The pod template of :meth:`Scenario.submit`: one container, running for ``runtime``."""
    metadata: dict[str, Any] = {"annotations": {keys.SIM_RUNTIME: runtime}}
    if labels is not None:
        metadata["labels"] = labels
    return {"metadata": metadata, "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


class Scenario:
    """One test's namespaces, tenants and jobs (all removed afterwards)."""

    def __init__(self, kube: Any, make_nodes: Callable[..., list[str]]) -> None:
        self.kube = kube
        self.core = client.CoreV1Api(kube)
        self.custom = client.CustomObjectsApi(kube)
        self.make_nodes = make_nodes
        self.id = f"op{next(_ids)}-{int(time.time()) % 100000}"
        self.namespaces: list[str] = []
        self.quotas: list[str] = []
        self.priorities: list[str] = []
        self._nodes = 0

    # --- setup ----------------------------------------------------------------------------

    def nodes(
        self,
        count: int,
        *,
        fixture: str = "hgx-h100-sxm-8gpu-8nic",
        objects: Callable[[str], tuple[Any, Any]] | None = None,
        product: str = H100,
        **labels: str,
    ) -> list[str]:
        """kwok nodes with the fixture's NodeGpuTopology (or the one ``objects`` gives for a
        node name), in the operator's pool."""
        names = [f"{self.id}-n{i}" for i in range(self._nodes, self._nodes + count)]
        self._nodes += count
        for name in names:
            spec, status = objects(name) if objects else fixture_objects(fixture, name)
            self.make_nodes(
                1,
                len(spec.gpus),
                names=[name],
                labels={POOL_LABEL: POOL, keys.GFD_PRODUCT: product, **labels},
                topology=spec,
                status=status,
            )
        return names

    def namespace(self, suffix: str) -> str:
        name = f"{self.id}-{suffix}"
        self.core.create_namespace({"metadata": {"name": name}})
        self.namespaces.append(name)
        return name

    def tenant(self, suffix: str, *, guaranteed: int = 0, **spec: Any) -> tuple[str, str]:
        """A TenantQuota owning one fresh namespace; returns (quota name, namespace)."""
        namespace = self.namespace(suffix)
        return self.quota(suffix, [namespace], guaranteed=guaranteed, **spec), namespace

    def quota(self, suffix: str, namespaces: list[str], *, guaranteed: int = 0, **spec: Any) -> str:
        """A TenantQuota over existing namespaces; returns its name."""
        name = f"{self.id}-{suffix}"
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": "TenantQuota",
            "metadata": {"name": name},
            "spec": {"namespaces": namespaces, "guaranteedGpus": guaranteed, **spec},
        }
        self.custom.create_cluster_custom_object(G, V, "tenantquotas", body)
        self.quotas.append(name)
        return name

    def priority(self, suffix: str, value: int) -> str:
        name = f"{self.id}-{suffix}"
        client.SchedulingV1Api(self.kube).create_priority_class(
            {"metadata": {"name": name}, "value": value}  # type: ignore[arg-type]
        )
        self.priorities.append(name)
        return name

    def submit(
        self,
        namespace: str,
        name: str,
        gpus: int,
        *,
        replicas: int = 1,
        runtime: str = "1h",
        grace: int = 0,
        **spec: Any,
    ) -> str:
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": "GpuJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": replicas,
                "gpusPerReplica": gpus,
                "checkpointGracePeriodSeconds": grace,
                "template": job_template(runtime=runtime),
                **spec,
            },
        }
        self.custom.create_namespaced_custom_object(G, V, namespace, "gpujobs", body)
        return name

    def cleanup(self) -> None:
        for name in self.quotas:
            with suppress(ApiException):
                self.custom.delete_cluster_custom_object(G, V, "tenantquotas", name)
        for name in self.priorities:
            with suppress(ApiException):
                client.SchedulingV1Api(self.kube).delete_priority_class(name)
        for name in self.namespaces:
            with suppress(ApiException):
                self.core.delete_namespace(name, grace_period_seconds=0)

    # --- reading --------------------------------------------------------------------------

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(G, V, namespace, "gpujobs", name))

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.job(namespace, name).get("status") or {})

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
        for c in self.status(namespace, name).get("conditions") or []:
            if c["type"] == type_:
                return dict(c)
        return None

    def pods(self, namespace: str, job: str | None = None) -> list[Any]:
        selector = f"{keys.LABEL_JOB_NAME}={job}" if job else keys.LABEL_JOB_NAME
        return list(self.core.list_namespaced_pod(namespace, label_selector=selector).items)

    def finish(self, namespace: str, job: str, exit_code: int = 0) -> None:
        """The containers of the job's pods exit now (as a kubelet reports it): a job's end at a
        moment the test chooses, instead of after a simulated runtime it would have to race."""
        phase = "Succeeded" if exit_code == 0 else "Failed"
        for pod in self.pods(namespace, job):
            terminated = {
                "exitCode": exit_code,
                "reason": "Completed" if not exit_code else "Error",
            }
            self.core.patch_namespaced_pod_status(
                pod.metadata.name,
                namespace,
                {
                    "status": {
                        "phase": phase,
                        "containerStatuses": [
                            {
                                "name": c.name,
                                "image": c.image,
                                "imageID": "",
                                "ready": False,
                                "restartCount": 0,
                                "state": {"terminated": terminated},
                            }
                            for c in pod.spec.containers
                        ],
                    }
                },
            )

    def quota_status(self, name: str) -> dict[str, Any]:
        obj = self.custom.get_cluster_custom_object(G, V, "tenantquotas", name)
        return dict(obj.get("status") or {})

    def wait_phase(
        self, namespace: str, name: str, phase: str, timeout: float = 60
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            status = self.status(namespace, name)
            return status if status.get("phase") == phase else None

        return wait_for(check, timeout, f"{namespace}/{name} to be {phase}")

    def wait_reason(
        self, namespace: str, name: str, reason: str, timeout: float = 60
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            status = self.status(namespace, name)
            return status if status.get("reason") == reason else None

        return wait_for(check, timeout, f"{namespace}/{name} to have reason {reason}")

    def events(self, namespace: str, name: str) -> list[tuple[str, str]]:
        items = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        ).items
        return [(e.reason, e.message) for e in items]


@contextmanager
def scenario(kube: Any, make_nodes: Callable[..., list[str]]) -> Iterator[Scenario]:
    s = Scenario(kube, make_nodes)
    try:
        yield s
    finally:
        s.cleanup()
