"""Development scaffolding: the local control plane, the fake NVML, demos and benchmarks.

Nothing in the product packages (``operator``, ``scheduler``, ``device_probe``, ``core``, ``api``)
imports from here; a deployed component never carries a local cluster or a simulated GPU. The CLI
reaches these modules lazily, only from its development subcommands.
"""
