"""A local Kubernetes control plane for development, tests, benchmarks and the demo.

Real kube-apiserver, etcd, kube-controller-manager and kube-scheduler built from pinned upstream
Go modules, plus kwok for simulated GPU nodes. No Docker, no root, loopback only.
"""

from gpusched.dev.localcluster.binaries import Toolchain, ensure_toolchain
from gpusched.dev.localcluster.cluster import ClusterError, LocalCluster, default_state_dir

__all__ = ["ClusterError", "LocalCluster", "Toolchain", "default_state_dir", "ensure_toolchain"]
