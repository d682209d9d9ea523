"""Does a stop on SLURM's early signal fit before the time limit? Measured by the run itself.

The signal (SIGUSR1, `signal_lead_s` seconds before the limit) lands during a step; the loop
finishes that step, evaluates if the step is an evaluation step, saves a checkpoint, and exits.
All of it must end before the limit, when SLURM sends SIGTERM and, KillWait seconds later,
SIGKILL. The run knows what each part costs on this machine and model: the longest step, the
longest evaluation and the longest save so far; when their sum exceeds the lead, it says so
with the figure to set.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

MARGIN = 1.25  # the lead advised over the measured worst case (a slower file system, a bigger last batch)


class StopBudget:
    """The longest step, evaluation and save of this run, against the signal's lead (None:
    no signal comes, nothing to check)."""

    def __init__(self, lead_s: float | None):
        self.lead_s = lead_s
        self.step_s = self.eval_s = self.save_s = 0.0
        self._warned_at = 0.0

    def step(self, seconds: float) -> None:
        self.step_s = max(self.step_s, seconds)

    def evaluation(self, seconds: float) -> None:
        self.eval_s = max(self.eval_s, seconds)

    def save(self, seconds: float) -> None:
        """A checkpoint written: the first time the whole cost is known, so checked here."""
        self.save_s = max(self.save_s, seconds)
        self.check()

    @property
    def needed_s(self) -> float:
        return self.step_s + self.eval_s + self.save_s

    def check(self) -> None:
        if self.lead_s is None:
            return
        needed = self.needed_s
        if needed <= self.lead_s or needed <= self._warned_at * 1.1:
            return
        self._warned_at = needed
        logger.warning(
            "a stop at SLURM's signal needs up to %.0f s here (a step %.1f s + an evaluation "
            "%.1f s + a checkpoint %.1f s), more than the %.0f s the signal comes before the "
            "time limit: the job may be killed before its checkpoint is written. Raise the "
            "rule's resources signal_lead_s to at least %.0f",
            needed, self.step_s, self.eval_s, self.save_s, self.lead_s, needed * MARGIN,
        )  # fmt: skip
