"""`fid` whose every optimizer step first sleeps: a model whose step takes longer than SLURM's
KillWait, without the CPU cost of one (the tests' cluster has 2 real cores), or steps of a known
length however loaded the cores are.

    python slow_steps.py SECONDS [--always] FID_ARGS...

Only the first start of a SLURM job is slowed (SLURM_RESTART_COUNT unset or 0), so that the
requeued start finishes before the next early signal; with --always every start is (the
workflow's ranks do not see SLURM_RESTART_COUNT: its job step drops SLURM_* variables).
"""

import os
import sys
import time

import fid.training.step as step
from fid.cli import command

if __name__ == "__main__":
    seconds = float(sys.argv.pop(1))
    always = sys.argv[1] == "--always"
    if always:
        sys.argv.pop(1)
    if always or int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0:
        real = step.accumulate_gradients

        def slow(*args, **kwargs):
            time.sleep(seconds)
            return real(*args, **kwargs)

        step.accumulate_gradients = slow
    command()
