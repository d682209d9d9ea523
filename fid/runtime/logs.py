"""Run logging: the console/file log, progress of long loops, metrics.jsonl, TensorBoard
scalars and peak memory.

Units: every quality metric (exact match, F1, retrieval top-k accuracy, the retriever's
candidate agreement and answer recall) is a percentage, 0-100, in every log line, metrics file
and report table; log lines label it ("EM 6.31%").
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import resource
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_ENV = "FID_PROGRESS_INTERVAL_S"
DEFAULT_PROGRESS_INTERVAL_S = 30.0


def setup_logging(rank: int = 0, file: str | Path | None = None) -> None:
    """Rank 0 logs at INFO, other ranks at WARNING; the format carries the rank.

    Called once, by the CLI. A `file` gets the same records (appended, so a resumed run's log
    continues the interrupted one's).
    """
    level = logging.INFO if rank == 0 else logging.WARNING
    formatter = logging.Formatter(
        f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"
    )
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if file is not None:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(file))
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_fid_handler", False):  # ours, from an earlier call
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        handler._fid_handler = True
        root.addHandler(handler)
    root.setLevel(level)
    # transformers and friends are chatty at INFO.
    for name in ("transformers", "torch", "urllib3", "filelock", "huggingface_hub"):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    # ... and draw a "Loading weights" progress bar per model load, one per rank, into logs.
    # Read when huggingface_hub is first imported: an import here would cost every light
    # command ~0.7 s (measured), and those never load transformers.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


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
            self._log.info("%s", str(self))  # now: a record formats its args later
        return True

    def __str__(self) -> str:
        d = self.format_dict
        n, total, elapsed, unit = d["n"], d["total"], d["elapsed"], d["unit"]
        done = n - d["initial"]
        # The smoothed recent rate while running; the overall one at the end (tqdm drops
        # the smoothing on close) or before there is one.
        rate = d["rate"] or (done / elapsed if elapsed > 0 and done else None)
        if total:
            parts = [f"{self.desc}: {n:,}/{total:,} {unit} ({100 * n / total:.0f}%)"]
        else:
            parts = [f"{self.desc}: {n:,} {unit}"]
        if rate:
            parts.append(f"{rate:,.0f} {unit}/s" if rate >= 1000 else f"{rate:.3g} {unit}/s")
        parts.append(f"elapsed {tqdm.format_interval(elapsed)}")
        if total and n >= total:
            parts.append("done")
        elif total:
            parts.append(f"ETA {tqdm.format_interval((total - n) / rate) if rate else '?'}")
        return ", ".join(parts)


def progress(
    iterable: Iterable | None = None,
    *,
    desc: str,
    unit: str,
    total: int | None = None,
    log: logging.Logger | None = None,
    interval_s: float | None = None,
) -> tqdm:
    """Progress of a long loop: tqdm's bar on a terminal, log lines elsewhere.

    When stderr is not a terminal (the workflow's jobs, whose logs go to files), a bar would
    write nothing readable for minutes; the same counters are logged instead: count/total,
    rate, elapsed time and ETA, at most one line per `interval_s` seconds plus a last line.
    Nothing is shown when `log` does not log INFO (ranks other than 0).

    Args:
        iterable: what to iterate over (or None, and call `update(n)`), as for tqdm.
        desc: what is counted ("embed").
        unit: the counted items, plural ("passages").
        total: the item count, when `iterable` has no len(); None: no percentage or ETA.
        log: the logger the lines go to (the caller's module logger); default fid.runtime.logs.
        interval_s: seconds between lines; default ${FID_PROGRESS_INTERVAL_S} or 30.

    Returns:
        A tqdm (iterate over it, or call `update(n)` and `close()`, or use it as a context).
    """
    log = log or logger
    disable = not log.isEnabledFor(logging.INFO)
    if sys.stderr.isatty():
        return tqdm(iterable, desc=desc, unit=unit, total=total, disable=disable)
    if interval_s is None:
        raw = os.environ.get(PROGRESS_INTERVAL_ENV, str(DEFAULT_PROGRESS_INTERVAL_S))
        try:
            interval_s = float(raw)
        except ValueError:
            raise ValueError(
                f"{PROGRESS_INTERVAL_ENV}={raw!r}: expected the seconds between progress lines"
            ) from None
    return _LoggedProgress(
        iterable, desc=desc, unit=unit, total=total, disable=disable, mininterval=interval_s,
        log=log,
    )  # fmt: skip


class MetricsWriter:
    """Appends one JSON object per record to metrics.jsonl and mirrors scalars to TensorBoard.

    On resume, records logged after the checkpoint that the run resumes from are dropped, so the
    file never holds two records of one step and kind.
    """

    def __init__(self, path: str | Path, tensorboard_dir: str | Path | None, resume_step: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept))
        self._file = open(self.path, "a")  # noqa: SIM115 (open for the writer's lifetime)
        self._tensorboard = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(tensorboard_dir), purge_step=resume_step + 1)

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        """Records `values` of a `kind` ("train", "dev") at optimizer step `step`."""
        record = {"kind": kind, "step": step, **values}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tensorboard.add_scalar(f"{kind}/{name}", value, step)

    def close(self) -> None:
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()


class PeakMemory:
    """Peak memory since the last `reset()`: CUDA max allocated on GPU, process RSS on CPU.

    On Linux the RSS peak (VmHWM) is reset through /proc/self/clear_refs, so each logging
    interval reports its own peak; elsewhere the process-lifetime peak (ru_maxrss) is reported.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._status = Path("/proc/self/status")
        self._clear_refs = Path("/proc/self/clear_refs")
        self.reset()

    def reset(self) -> None:
        import torch  # here, not at the top: fid.metrics logs progress without torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._clear_refs.exists():
            # Not permitted in some sandboxes: the lifetime peak is reported then.
            with contextlib.suppress(OSError):
                self._clear_refs.write_text("5")

    def peak_mb(self) -> float:
        import torch

        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self._status.exists():
            match = re.search(r"VmHWM:\s+(\d+) kB", self._status.read_text())
            if match:
                return int(match.group(1)) / 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
