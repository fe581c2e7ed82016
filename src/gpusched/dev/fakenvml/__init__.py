"""The fake NVML backend: simulated GPU nodes from real ``nvidia-smi topo -m`` matrices.

Used by unit and integration tests, the demo and ``gpusched probe --fake``. Only NVML and sysfs
are simulated; everything above them is the probe's production code.
"""

from gpusched.dev.fakenvml.faults import Fault, FaultError, FaultFeed, parse_fault
from gpusched.dev.fakenvml.node import FakeNode, FakeSourceError, fake_node, load_topology
from gpusched.dev.fakenvml.nvml import FakeNvml, fake_gpu_uuid, product_name
from gpusched.dev.fakenvml.pcie_plan import FakeTopologyError, PciePlan, plan_pcie

__all__ = [
    "FakeNode",
    "FakeNvml",
    "FakeSourceError",
    "FakeTopologyError",
    "Fault",
    "FaultError",
    "FaultFeed",
    "PciePlan",
    "fake_gpu_uuid",
    "fake_node",
    "load_topology",
    "parse_fault",
    "plan_pcie",
    "product_name",
]
