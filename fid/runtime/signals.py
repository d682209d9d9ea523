"""SIGUSR1 and SIGTERM recorded instead of dying, so that training can stop cleanly.

Only the standard library: the `fid` command installs the record before importing torch, so a
signal in its first seconds is recorded too.
"""

from __future__ import annotations

import signal
import threading


class Preempted(Exception):
    """Training stopped on SIGUSR1/SIGTERM after writing a complete checkpoint; rerun to resume.
    (Here, not beside the loop, so that the command can catch it without importing torch.)

    Attributes:
        signals: the stop signals this process received (SIGUSR1: SLURM's time-limit warning;
            SIGTERM: a cancel, a preemption or the time limit itself).
        steps: the optimizer steps this start of the run made before the stop.
        trained_s: seconds this start trained, from its first step to the stop.
        startup_s: seconds from the process's start to its first step.
    """

    def __init__(
        self,
        message: str,
        signals: frozenset[int] = frozenset(),
        steps: int = 0,
        trained_s: float = 0.0,
        startup_s: float = 0.0,
    ):
        super().__init__(message)
        self.signals = signals
        self.steps = steps
        self.trained_s = trained_s
        self.startup_s = startup_s


class StopSignals:
    """Records SIGUSR1 and SIGTERM (SLURM's warnings before preemption or the time limit)
    instead of dying, so the loop can finish its step and save.

    One per process (STOP_SIGNALS), re-entrant: the loop holds it for its steps; the `fid`
    command holds it for the whole of a training run, so that a signal during start-up stops the
    loop at its first step, with a checkpoint, and one while the finished model is exported is
    no kill of a completed job. When the outermost holder leaves, the old handlers come back, or
    in the `fid` process (`ignore_when_released()`) the signals are ignored until it exits.
    """

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None  # the last one
        self.every_received: set[int] = set()
        self._depth = 0
        self._previous = {}
        self._ignore_when_released = False

    def __enter__(self):
        if self._depth == 0 and threading.current_thread() is threading.main_thread():
            self.received = None
            self.every_received = set()
            for number in self.SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        self._depth += 1
        return self

    def _handle(self, number, frame):
        self.received = number
        self.every_received.add(number)

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            for number, handler in self._previous.items():
                signal.signal(number, signal.SIG_IGN if self._ignore_when_released else handler)
            self._previous.clear()

    def ignore_when_released(self) -> None:
        """For a process that ends after its run: the signals are ignored, not given back to
        their old handlers, when the outermost holder leaves. While the interpreter shuts down
        Python resets the handlers it installed to the default action, death, and freeing torch
        takes long enough for SLURM's late signal to turn a finished job's exit into a kill; an
        ignore survives the shutdown."""
        self._ignore_when_released = True

    def ignore(self) -> None:
        """Ignores the signals from now on (a run stopped with its checkpoint written)."""
        for number in self.SIGNALS:
            signal.signal(number, signal.SIG_IGN)


STOP_SIGNALS = StopSignals()
