"""The KubeSchedulerConfiguration of the kube-scheduler that serves the ``gpusched`` profile.

Extenders apply to every profile of a kube-scheduler process, so gpusched runs its own
kube-scheduler (beside the extender, in one pod) serving only the ``gpusched`` profile; the
cluster's default scheduler is untouched.
"""

from __future__ import annotations

from typing import Any

from gpusched.api import keys


def profile() -> dict[str, Any]:
    """The ``gpusched`` profile: pack GPUs onto nodes (MostAllocated) so whole, well-wired
    sets stay free for large jobs; the extender decides among GPUs inside a node.

    kube-scheduler's own preemption is off: it counts GPUs but cannot see wiring, quotas or
    gangs, so it could evict another tenant's pod for a pod that still would not fit. The
    operator's admission cycle decides preemption for GpuJobs.

    Every feasible node is sent to the extender (``percentageOfNodesToScore: 100``): by default
    kube-scheduler stops looking once it has found a share of the cluster, and the best-wired
    node, or the node admission planned, could be outside that share.
    """
    return {
        "schedulerName": keys.SCHEDULER_NAME,
        "percentageOfNodesToScore": 100,
        "plugins": {"postFilter": {"disabled": [{"name": "DefaultPreemption"}]}},
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": "MostAllocated",
                        "resources": [
                            {"name": keys.GPU_RESOURCE, "weight": 5},
                            {"name": "cpu", "weight": 1},
                            {"name": "memory", "weight": 1},
                        ],
                    }
                },
            }
        ],
    }


def extender(url: str, *, http_timeout: str = "30s") -> dict[str, Any]:
    """The extender stanza: filter and bind over HTTP for GPU pods only.

    No prioritize verb: filter passes the one node gpusched's ranking puts first (or every node
    tied for first, for pods whose soft preferences kube-scheduler's own scores weigh), so a
    prioritize round trip would have nothing to decide. The endpoint still answers for
    configurations that call it."""
    return {
        "urlPrefix": url.rstrip("/"),
        "filterVerb": "filter",
        "bindVerb": "bind",
        "enableHTTPS": url.startswith("https://"),
        "httpTimeout": http_timeout,
        "nodeCacheCapable": True,
        "ignorable": False,
        "managedResources": [{"name": keys.GPU_RESOURCE, "ignoredByScheduler": False}],
    }


def kube_scheduler_config(
    extender_url: str,
    *,
    kubeconfig: str | None = None,
    leader_elect: bool = True,
    qps: int = 200,
    burst: int = 400,
) -> dict[str, Any]:
    """A complete configuration for ``kube-scheduler --config``."""
    connection: dict[str, Any] = {"qps": qps, "burst": burst}
    if kubeconfig:
        connection["kubeconfig"] = kubeconfig
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": connection,
        "leaderElection": {
            "leaderElect": leader_elect,
            "resourceName": "gpusched-scheduler",
            "resourceNamespace": "kube-system",
        },
        "profiles": [profile()],
        "extenders": [extender(extender_url)],
    }
