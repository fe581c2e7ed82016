"""The Helm chart in deploy/helm/gpusched: its generated files, and rendering it with the pinned
helm so the local harness runs components under exactly the identities the chart creates."""
