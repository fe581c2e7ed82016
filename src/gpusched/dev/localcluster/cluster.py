"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, with RBAC on and simulated nodes.

Used by the integration and e2e tests, the benchmarks and the demo. Everything a cluster needs
lives in one state directory (certificates, kubeconfigs, etcd data, logs, ``state.json``), so a
cluster started by one process can be inspected or torn down by another (``gpusched cluster
down``). Ports are picked free at start-up; nothing listens beyond 127.0.0.1, except the API
server on the pod network's gateway when a cluster has one (podnetwork.py).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpusched.api import keys
from gpusched.dev.localcluster import pki, podnetwork
from gpusched.dev.localcluster.binaries import Progress, Toolchain, cache_dir, default_progress
from gpusched.dev.localcluster.processes import (
    ProcessRecord,
    exit_code,
    free_port,
    is_running,
    port_in_use,
    spawn,
    stop,
)

SERVICE_CIDR = "10.96.0.0/16"
#: Node and pod lifecycle of simulated nodes (see the file's header).
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
KWOK_NODE_CIDR = "10.244.0.0/16"


class ClusterError(RuntimeError):
    """The local cluster could not be started or reached; the message says which part and why."""


def default_state_dir(name: str = "dev") -> Path:
    """Where the cluster called ``name`` keeps its files; its kubeconfig is ``<dir>/kubeconfig``."""
    return cache_dir() / "clusters" / name


@dataclass
class ClusterState:
    """What ``state.json`` records about a running cluster."""

    directory: Path
    ports: dict[str, int] = field(default_factory=dict)
    processes: list[ProcessRecord] = field(default_factory=list)
    binaries: dict[str, str] = field(default_factory=dict)
    pod_network: bool = False
    """The API server also listens on the pod network's gateway (podnetwork.py)."""

    @property
    def file(self) -> Path:
        """Path of ``state.json``."""
        return self.directory / "state.json"

    def save(self) -> None:
        """Write the state atomically."""
        payload = {
            "ports": self.ports,
            "processes": [record.to_json() for record in self.processes],
            "binaries": self.binaries,
            "pod_network": self.pod_network,
        }
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=2))
        tmp.replace(self.file)

    @classmethod
    def load(cls, directory: Path) -> ClusterState:
        """Read ``state.json`` of the cluster in ``directory``."""
        path = directory / "state.json"
        if not path.exists():
            raise ClusterError(f"no local cluster in {directory} (no state.json)")
        payload = json.loads(path.read_text())
        return cls(
            directory=directory,
            ports={k: int(v) for k, v in payload["ports"].items()},
            processes=[ProcessRecord(**record) for record in payload["processes"]],
            binaries=dict(payload.get("binaries", {})),
            pod_network=bool(payload.get("pod_network", False)),
        )


class LocalCluster:
    """One control plane in one state directory.

    ``up()`` starts it (replacing any previous cluster in that directory), ``down()`` stops every
    process it started, including extra ones registered with ``spawn()``.
    """

    def __init__(
        self,
        state_dir: Path,
        toolchain: Toolchain | None = None,
        progress: Progress = default_progress,
        *,
        pod_network: bool = False,
    ) -> None:
        self.state_dir = state_dir
        self.toolchain = toolchain
        self.progress = progress
        self.state = ClusterState(directory=state_dir, pod_network=pod_network)
        self.pod_network = pod_network

    # --- paths and addresses ----------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (system:masters)."""
        return self.state_dir / "kubeconfig"

    @property
    def pki_dir(self) -> Path:
        """Certificates and keys."""
        return self.state_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        """One log file per process."""
        return self.state_dir / "logs"

    @property
    def server(self) -> str:
        """The API server URL."""
        return f"https://127.0.0.1:{self.state.ports['apiserver']}"

    @property
    def ca_cert(self) -> Path:
        """CA certificate that signed the API server's serving certificate."""
        return self.pki_dir / "ca.crt"

    def binary(self, name: str) -> str:
        """Path of a control-plane binary (``kubectl``, ``kube-scheduler``, ...)."""
        if name in self.state.binaries:
            return self.state.binaries[name]
        if self.toolchain is None:
            raise ClusterError("no toolchain: build one with ensure_toolchain()")
        return str(self.toolchain.path(name))

    @classmethod
    def attach(cls, state_dir: Path, progress: Progress = default_progress) -> LocalCluster:
        """The cluster already running (or left behind) in ``state_dir``."""
        cluster = cls(state_dir, progress=progress)
        cluster.state = ClusterState.load(state_dir)
        return cluster

    # --- lifecycle -------------------------------------------------------------------------

    def up(self, timeout: float = 180.0) -> LocalCluster:
        """Start every component and wait until the cluster accepts pods."""
        if self.toolchain is None:
            raise ClusterError("no toolchain: build one with ensure_toolchain()")
        if (self.state_dir / "state.json").exists():
            LocalCluster.attach(self.state_dir, self.progress).down()
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)
        self.state_dir.mkdir(parents=True)
        self.state = ClusterState(
            directory=self.state_dir,
            binaries={name: str(path / name) for name, path in self.toolchain.directory.items()},
            pod_network=self.pod_network,
        )
        started = time.monotonic()
        try:
            if self.pod_network:
                podnetwork.ensure_bridge()
            self._allocate_ports()
            self._write_credentials()
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
            self._start_controller_manager()
            self._start_scheduler()
            self._start_kwok()
            self._wait_for_controllers(timeout)
        except BaseException:
            self.down()
            raise
        self.progress(
            f"[cluster] ready in {time.monotonic() - started:.1f}s: {self.server}, "
            f"kubeconfig {self.kubeconfig}"
        )
        return self

    def down(self) -> None:
        """Stop every process of this cluster (newest first) and forget them."""
        for record in reversed(self.state.processes):
            stop(record)
        if self.state.processes:
            self.progress(f"[cluster] stopped {len(self.state.processes)} processes")
        self.state.processes = []
        if self.state.pod_network:
            podnetwork.remove_all()
        if self.state.file.exists():
            self.state.save()

    def spawn(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> ProcessRecord:
        """Start a further process that belongs to this cluster and is stopped by ``down()``."""
        record = spawn(name, argv, self.logs_dir / f"{name}.log", env=env)
        self.state.processes.append(record)
        self.state.save()
        return record

    def stop_process(self, record: ProcessRecord) -> None:
        """Stop one process started with ``spawn()``."""
        stop(record)
        self.state.processes = [p for p in self.state.processes if p != record]
        self.state.save()

    def restart_apiserver(self, timeout: float = 60.0) -> None:
        """Stop kube-apiserver and start it again on the same port: every watch ends, and its
        watch cache starts afresh, so a client resuming from a version before the restart gets
        ``410 Gone`` and must list again."""
        for record in [p for p in self.state.processes if p.name == "kube-apiserver"]:
            self.stop_process(record)
        self._start_apiserver(timeout)
        self._wait_admission_settled(timeout)

    def _wait_admission_settled(self, timeout: float) -> None:
        """Until admission policies whose parameters are custom resources can resolve them:
        for a few seconds after a start, before the CRDs' discovery is loaded, such a policy
        refuses every request it matches ("failed to configure policy"), and before that the
        CRDs themselves are not served (404, 503). A server-side dry run of a GpuJob tells; an
        acceptance, or a refusal of the admission chain for a reason of its own, is settled."""
        job = json.dumps(
            {
                "apiVersion": keys.API_VERSION,
                "kind": "GpuJob",
                "metadata": {"name": "admission-settled"},
                "spec": {
                    "gpusPerReplica": 1,
                    "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                },
            }
        ).encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            request = urllib.request.Request(
                f"{self.server}/apis/{keys.API_VERSION}/namespaces/default/gpujobs?dryRun=All",
                data=job,
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, context=self.ssl_context(), timeout=5):
                    return
            except urllib.error.HTTPError as err:
                # 503 (or 404): the CRD is not served yet either; wait for an answer of the
                # admission chain itself.
                body = err.read().decode(errors="replace")
                if err.code < 500 and err.code != 404 and "failed to configure policy" not in body:
                    return
            time.sleep(0.5)
        raise ClusterError("admission policies did not settle after the API server restarted")

    def processes(self) -> list[ProcessRecord]:
        """Processes this cluster started and has not stopped."""
        return list(self.state.processes)

    def ports(self) -> dict[str, int]:
        """Every port the cluster listens on, by component."""
        return dict(self.state.ports)

    def status(self) -> dict[str, bool]:
        """Whether each recorded process still runs."""
        return {record.name: is_running(record) for record in self.state.processes}

    # --- clients ---------------------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster as admin."""
        result = subprocess.run(
            [self.binary("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def install_crds(self, directory: Path, timeout: float = 60) -> None:
        """Apply the CRDs in ``directory`` and wait until the API server serves them.

        Server-side apply, because the GpuJob CRD is too large for the client-side
        last-applied annotation.
        """
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(directory))
        names = [
            doc["metadata"]["name"]
            for path in sorted(directory.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") == "CustomResourceDefinition"
        ]
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                code, body = self.get(
                    f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                )
                conditions = (
                    json.loads(body).get("status", {}).get("conditions", []) if code == 200 else []
                )
                if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRD {name} not established after {timeout:.0f}s")
                time.sleep(0.1)

    def api_client(self) -> Any:
        """A ``kubernetes`` client configured as admin (imported lazily: optional dependency)."""
        from gpusched.kube import api_client

        return api_client(self.kubeconfig)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context that trusts the cluster CA and presents the admin certificate."""
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        context.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        return context

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET an API server path as admin; returns status code and body."""
        request = urllib.request.Request(self.server + path)
        try:
            with urllib.request.urlopen(
                request, context=self.ssl_context(), timeout=timeout
            ) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def identity_kubeconfig(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for a further client-certificate identity (for RBAC tests)."""
        ca = pki.CertificateAuthority.load(self.pki_dir)
        pair = ca.issue(f"user-{name}", user, groups)
        return pki.write_kubeconfig(
            self.state_dir / f"{name}.kubeconfig", self.server, self.ca_cert, user, credentials=pair
        )

    # --- start-up steps --------------------------------------------------------------------

    def _allocate_ports(self) -> None:
        taken: set[int] = set()
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"):
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            self.state.ports[name] = port
        self.state.save()

    def _write_credentials(self) -> None:
        ca = pki.CertificateAuthority.create(self.pki_dir)
        pki.write_service_account_keys(self.pki_dir)
        ca.issue(
            "apiserver",
            "kube-apiserver",
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server_ips=(
                "127.0.0.1",
                "10.96.0.1",
                *((podnetwork.GATEWAY,) if self.state.pod_network else ()),
            ),
        )
        identities = {
            "admin": ("gpusched-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
            # kwok plays every kubelet; system:masters spares a hand-written kubelet role.
            "kwok": ("kwok-controller", ("system:masters",)),
        }
        server = f"https://127.0.0.1:{self.state.ports['apiserver']}"
        for name, (user, groups) in identities.items():
            pair = ca.issue(name, user, groups)
            target = self.kubeconfig if name == "admin" else self.state_dir / f"{name}.kubeconfig"
            pki.write_kubeconfig(target, server, ca.cert_path, user, credentials=pair)

    def _start_etcd(self, timeout: float) -> None:
        port, peer = self.state.ports["etcd"], self.state.ports["etcd-peer"]
        record = self.spawn(
            "etcd",
            [
                self.binary("etcd"),
                f"--data-dir={self.state_dir / 'etcd'}",
                "--name=gpusched-local",
                f"--listen-client-urls=http://127.0.0.1:{port}",
                f"--advertise-client-urls=http://127.0.0.1:{port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=gpusched-local=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", record, timeout, lambda: _http_ok(f"http://127.0.0.1:{port}/health"))

    def _start_apiserver(self, timeout: float) -> None:
        pki_dir = self.pki_dir
        record = self.spawn(
            "kube-apiserver",
            [
                self.binary("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.state.ports['etcd']}",
                # With a pod network, pods reach it at the gateway (podnetwork.py).
                f"--bind-address={'0.0.0.0' if self.state.pod_network else '127.0.0.1'}",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.state.ports['apiserver']}",
                f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
                f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
                f"--client-ca-file={pki_dir / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki_dir / 'sa.pub'}",
                f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                # No kube-proxy here: webhooks (the operator's) are called at their Service's
                # endpoints, not its cluster IP.
                "--enable-aggregator-routing=true",
                "--max-requests-inflight=1600",
                "--max-mutating-requests-inflight=800",
                # GPUSCHED_PROFILING=1 serves /debug/pprof (CPU profiles of the API server for
                # benchmarks: `go tool pprof` on /debug/pprof/profile with the admin kubeconfig).
                f"--profiling={'true' if os.environ.get('GPUSCHED_PROFILING') == '1' else 'false'}",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver", record, timeout, lambda: self._api_ok("/readyz"))

    def _start_controller_manager(self) -> None:
        kubeconfig = self.state_dir / "controller-manager.kubeconfig"
        self.spawn(
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.state.ports['controller-manager']}",
                "--leader-elect=false",
                f"--service-account-private-key-file={self.pki_dir / 'sa.key'}",
                f"--root-ca-file={self.ca_cert}",
                "--use-service-account-credentials=true",
                # kwok nodes carry their own pod CIDRs; volumes do not exist here.
                "--controllers=*,-node-ipam-controller,-persistentvolume-attach-detach-controller",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--concurrent-gc-syncs=40",
                "--v=1",
            ],
        )

    def scheduler_config(
        self,
        profiles: list[dict[str, Any]],
        extenders: list[dict[str, Any]] | None = None,
        kubeconfig: Path | None = None,
    ) -> dict[str, Any]:
        """A KubeSchedulerConfiguration for this cluster with the given profiles."""
        config: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {
                "kubeconfig": str(kubeconfig or self.state_dir / "scheduler.kubeconfig"),
                "qps": 500,
                "burst": 1000,
            },
            "leaderElection": {"leaderElect": False},
            "profiles": profiles,
        }
        if extenders:
            config["extenders"] = extenders
        return config

    def start_scheduler(
        self, name: str, config: dict[str, Any], port: int | None = None
    ) -> ProcessRecord:
        """Run a further kube-scheduler (e.g. one serving the ``gpusched`` profile)."""
        config_path = self.state_dir / f"{name}.config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = port or free_port()
        kubeconfig = config["clientConnection"]["kubeconfig"]
        return self.spawn(
            name,
            [
                self.binary("kube-scheduler"),
                f"--config={config_path}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--v=1",
            ],
        )

    def _start_scheduler(self) -> None:
        config = self.scheduler_config([{"schedulerName": "default-scheduler"}])
        self.start_scheduler("kube-scheduler", config, port=self.state.ports["scheduler"])

    def _start_kwok(self) -> None:
        self.spawn(
            "kwok",
            [
                self.binary("kwok"),
                f"--kubeconfig={self.state_dir / 'kwok.kubeconfig'}",
                f"--config={KWOK_STAGES}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--cidr={KWOK_NODE_CIDR}",
                "--node-ip=10.244.0.1",
                f"--server-address=127.0.0.1:{self.state.ports['kwok']}",
                "--node-lease-duration-seconds=40",
            ],
        )

    def _wait_for_controllers(self, timeout: float) -> None:
        """Pods can be created once the ServiceAccount controller made ``default/default``."""
        deadline = time.monotonic() + timeout
        self.progress("[cluster] waiting for controllers (default ServiceAccount, kwok)")
        while time.monotonic() < deadline:
            self._check_processes()
            code, _ = self.get("/api/v1/namespaces/default/serviceaccounts/default")
            if code == 200 and port_in_use(self.state.ports["kwok"]):
                return
            time.sleep(0.25)
        raise ClusterError(f"controllers not ready after {timeout:.0f}s; logs in {self.logs_dir}")

    # --- helpers ---------------------------------------------------------------------------

    def _api_ok(self, path: str) -> bool:
        try:
            code, _ = self.get(path, timeout=2.0)
        except (OSError, ssl.SSLError):
            return False
        return code == 200

    def _check_processes(self) -> None:
        for record in self.state.processes:
            if not is_running(record):
                raise ClusterError(
                    f"{record.name} exited (code {exit_code(record)}); last log lines:\n"
                    + _tail(Path(record.log))
                )

    def _wait(
        self, what: str, record: ProcessRecord, timeout: float, ready: Callable[[], bool]
    ) -> None:
        self.progress(f"[cluster] waiting for {what}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not is_running(record):
                raise ClusterError(
                    f"{what} exited during start-up (code {exit_code(record)}):\n"
                    + _tail(Path(record.log))
                )
            if ready():
                return
            time.sleep(0.1)
        raise ClusterError(f"{what} not ready after {timeout:.0f}s:\n" + _tail(Path(record.log)))


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def env_for(cluster: LocalCluster) -> dict[str, str]:
    """Environment that points kubectl and client libraries at ``cluster``."""
    return {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
