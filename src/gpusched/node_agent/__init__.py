"""gpusched's kubelet device plugin (``gpusched device-plugin``): containers get exactly the GPUs
the extender chose. See docs/node-agent.md; the decisions live in :mod:`gpusched.core.nodeagent`."""
