"""The benchmarks: scripts grouped by what they measure, and their shared harness (README.md).

A package so that the scripts import `benchmarks.harness` (and each other) by one name however
they are run; no benchmark runs on import.
"""
