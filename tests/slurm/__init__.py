"""Tests against a real SLURM started on this host by tests/slurm/harness.sh."""
