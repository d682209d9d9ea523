"""SIGUSR1 and SIGTERM recorded instead of dying, so that training can stop cleanly.

Only the standard library: the `fid` command installs the record before importing torch, so a
signal in its first seconds is recorded too.
"""

from __future__ import annotations

import signal
import threading


class StopSignals:
    """Records SIGUSR1 and SIGTERM (SLURM's warnings before preemption or the time limit)
    instead of dying, so the loop can finish its step and save.

    One per process (STOP_SIGNALS), re-entrant: the loop holds it for its steps and restores the
    old handlers when it leaves; the `fid` command holds it for the whole of a training run
    (`hold()`), so that a signal during start-up stops the loop at its first step, with a
    checkpoint, and one while the finished model is exported is no kill of a completed job.
    """

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self._depth = 0
        self._previous = {}

    def __enter__(self):
        if self._depth == 0 and threading.current_thread() is threading.main_thread():
            self.received = None
            for number in self.SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        self._depth += 1
        return self

    def _handle(self, number, frame):
        self.received = number

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            for number, handler in self._previous.items():
                signal.signal(number, handler)
            self._previous.clear()

    def hold(self) -> None:
        """Records the signals from now until the run is over (the `fid` command)."""
        self.__enter__()

    def ignore(self) -> None:
        """Ignores the signals from now on: the run is over (exported, or stopped with a
        checkpoint). While the interpreter shuts down, Python resets the handlers it installed to
        the default action, death, and freeing torch takes long enough for a late signal to turn
        a finished job's exit status into a kill; an ignore survives the shutdown."""
        for number in self.SIGNALS:
            signal.signal(number, signal.SIG_IGN)


STOP_SIGNALS = StopSignals()
