"""gpusched: Kubernetes GPU scheduling that follows the hardware's wiring."""

__version__ = "0.1.0"
