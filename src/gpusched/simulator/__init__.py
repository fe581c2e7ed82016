"""``gpusched simulate``: replay job traces through gpusched's own admission and placement code
(and through baselines standing for the schedulers people run today) on a virtual clock.

See docs/simulator.md for the trace format, the adapters, the job-speed model, the policies and
how to read the report.
"""
