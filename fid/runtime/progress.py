"""Progress of long loops: tqdm's bar on a terminal; on a log file or a workflow job's console,
tqdm's counters as log lines (count/total, rate, elapsed, ETA, and what the loop adds, e.g. the
loss) at most every FID_PROGRESS_INTERVAL_S seconds (30 by default) plus a final line. No torch:
pure-Python stages log progress too.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterable

from tqdm import tqdm

from fid.runtime.console import CONSOLE, job_console

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_ENV = "FID_PROGRESS_INTERVAL_S"
DEFAULT_PROGRESS_INTERVAL_S = 30.0


class _LoggedProgress(tqdm):
    """tqdm's counting, rate (smoothed) and timing, displayed as log lines instead of a bar.

    tqdm's own throttle bounds the lines: at most one per `mininterval` seconds (checked on
    every update: `miniters=1`), and a final one on close. A line is logged only when the count
    moved since the last one (none at the start, none twice at the end).
    """

    monitor_interval = 0  # no monitor thread: it would force displays between intervals

    def __init__(self, *args, log: logging.Logger, **kwargs):
        self._log = log
        self._logged_n = kwargs.get("initial", 0)
        # The bar's own output (tqdm writes '' and a newline on close) goes nowhere.
        super().__init__(*args, file=io.StringIO(), miniters=1, leave=True, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        # tqdm's documented hook for other front ends: called by refresh() and close().
        if msg is None and self.n != self._logged_n:
            self._logged_n = self.n
            # A workflow job's console gets the lines of a loop that runs long enough to
            # need them, not the last line of every brief one (the log file gets all).
            long = self.format_dict["elapsed"] >= self.mininterval
            self._log.info("%s", str(self), extra=CONSOLE if long else None)
        return True

    def __str__(self) -> str:
        d = self.format_dict
        n, total, elapsed, unit = d["n"], d["total"], d["elapsed"], d["unit"]
        done = n - d["initial"]
        # The smoothed recent rate while running; the overall one at the end (tqdm drops
        # the smoothing on close) or before there is one.
        rate = d["rate"] or (done / elapsed if elapsed > 0 and done else None)
        count = _bytes if unit == "B" else (lambda value: f"{value:,}")
        shown_unit = "" if unit == "B" else f" {unit}"
        if total:
            parts = [f"{self.desc}: {count(n)}/{count(total)}{shown_unit} ({100 * n / total:.0f}%)"]
        else:
            parts = [f"{self.desc}: {count(n)}{shown_unit}"]
        if rate and unit == "B":
            parts.append(f"{_bytes(rate)}/s")
        elif rate:
            parts.append(f"{rate:,.0f} {unit}/s" if rate >= 1000 else f"{rate:.3g} {unit}/s")
        parts.append(f"elapsed {tqdm.format_interval(elapsed)}")
        if total and n >= total:
            parts.append("done")
        elif total:
            parts.append(f"ETA {tqdm.format_interval((total - n) / rate) if rate else '?'}")
        if d["postfix"]:  # set_postfix(loss=...): "loss=1.234"
            parts.append(d["postfix"])
        return ", ".join(parts)


def _bytes(value: float) -> str:
    """A byte count as people read it: 512 B, 3.4 MB, 13.0 GB (decimal units, as disks)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def progress(
    iterable: Iterable | None = None,
    *,
    desc: str,
    unit: str,
    total: int | None = None,
    initial: int = 0,
    log: logging.Logger | None = None,
    interval_s: float | None = None,
) -> tqdm:
    """Progress of a long loop: tqdm's bar on a terminal, log lines elsewhere.

    When stderr is not a terminal (a log file), or is a workflow job's console (`--log-file`:
    several jobs and Snakemake share the terminal, and bars would cut each other's lines), the
    same counters are logged instead: count/total, rate, elapsed time and ETA, at most one line
    per `interval_s` seconds plus a last line. Nothing is shown when `log` does not log INFO
    (ranks other than 0).

    Args:
        iterable: what to iterate over (or None, and call `update(n)`), as for tqdm.
        desc: what is counted ("embed").
        unit: the counted items, plural ("passages"); "B" counts bytes, shown as kB/MB/GB.
        total: the item count, when `iterable` has no len(); None: no percentage or ETA.
        initial: the count already done (a resumed run), not counted in the rate.
        log: the logger the lines go to (the caller's module logger); default fid.runtime.progress.
        interval_s: seconds between lines; default ${FID_PROGRESS_INTERVAL_S} or 30.

    Returns:
        A tqdm (iterate over it, or call `update(n)` and `close()`, or use it as a context).
    """
    log = log or logger
    disable = not log.isEnabledFor(logging.INFO)
    if sys.stderr.isatty() and not job_console():
        return tqdm(iterable, desc=desc, unit=unit, total=total, initial=initial, disable=disable)
    if interval_s is None:
        raw = os.environ.get(PROGRESS_INTERVAL_ENV, str(DEFAULT_PROGRESS_INTERVAL_S))
        try:
            interval_s = float(raw)
        except ValueError:
            raise ValueError(
                f"{PROGRESS_INTERVAL_ENV}={raw!r}: expected the seconds between progress lines"
            ) from None
    return _LoggedProgress(
        iterable, desc=desc, unit=unit, total=total, initial=initial, disable=disable,
        mininterval=interval_s, log=log,
    )  # fmt: skip
