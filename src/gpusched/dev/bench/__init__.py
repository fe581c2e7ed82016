"""Benchmarks behind ``gpusched bench``; their recorded figures live in docs/benchmarks.md."""
