"""Run logging: the console/file log, metrics.jsonl, TensorBoard scalars and peak memory
(progress lines of long loops: fid.runtime.progress).

Units: every quality metric (exact match, F1, retrieval top-k accuracy, the retriever's
candidate agreement and answer recall) is a percentage, 0-100, in every log line, metrics file
and report table; log lines label it ("EM 6.31%").
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import sys
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from fid.errors import DataError
from fid.runtime.console import use_job_console
from fid.runtime.fileio import atomic_write_text
from fid.text_files import text_lines

logger = logging.getLogger(__name__)
_formatter: logging.Formatter | None = None  # setup_logging's, for add_log_file
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def setup_logging(rank: int = 0, file: str | Path | None = None, job: str | None = None) -> None:
    """Rank 0 logs at INFO, other ranks at WARNING; the format carries the rank.

    Called once, by the CLI. A `file` gets every record (appended, so a resumed run's log
    continues the interrupted one's). With a `job` label (`--log-file` named the log: a
    workflow job), the console is that job's few lines in a terminal shared with Snakemake and
    other jobs: progress at most every FID_PROGRESS_INTERVAL_S seconds, results, warnings and
    errors, each prefixed by the label; without one, the console gets every record. Python
    warnings become records, so that they reach the log file too.
    """
    global _formatter
    level = logging.INFO if rank == 0 else logging.WARNING
    formatter = _formatter = logging.Formatter(
        f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"
    )
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(formatter)
    use_job_console(console, job)
    handlers: list[logging.Handler] = [console]
    if file is not None:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        log_file = logging.FileHandler(file)
        log_file.setFormatter(formatter)
        handlers.append(log_file)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_fid_handler", False):  # ours, from an earlier call
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        handler._fid_handler = True
        root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    # transformers and friends are chatty at INFO (faiss: which CPU build it tried to load).
    for name in ("transformers", "torch", "urllib3", "filelock", "huggingface_hub", "faiss"):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    # ... and draw a "Loading weights" progress bar per model load, one per rank, into logs.
    # Read when huggingface_hub is first imported: an import here would cost every light
    # command ~0.7 s (measured), and those never load transformers.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def add_log_file(file: str | Path) -> None:
    """Also appends the log to `file` from now on (a run log known only once the command has
    found its state folder), in `setup_logging`'s format."""
    Path(file).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(file)
    handler.setFormatter(_formatter or logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler._fid_handler = True
    logging.getLogger().addHandler(handler)


def copy_earlier_starts(earlier: bytes, run_log: Path, log_file: Path) -> None:
    """Appends the earlier starts of a run (`earlier`: its own log `run_log`, read as the new
    start begins) to `log_file`, between two marker lines; nothing when there are none."""
    if not earlier.strip():
        return
    if not earlier.endswith(b"\n"):  # a start killed mid-line
        earlier += b"\n"
    with open(log_file, "ab") as out:
        out.write(f"==== earlier starts of this run (from {run_log}) ====\n".encode())
        out.write(earlier)
        out.write(b"==== this start ====\n")


class MetricsWriter:
    """Appends one JSON object per record to metrics.jsonl and mirrors scalars to TensorBoard.

    On resume, records logged after the checkpoint that the run resumes from are dropped, so the
    file never holds two records of one step and kind.
    """

    def __init__(self, path: str | Path, tensorboard_dir: str | Path | None, resume_step: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            kept = _records_up_to(self.path, resume_step)
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
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


def _records_up_to(path: Path, step: int) -> list[str]:
    """The lines of a metrics.jsonl whose step is at most `step`; a last line torn by a kill
    (not whole JSON) is dropped with a warning, a bad line elsewhere is an error naming it."""
    lines = [
        (number, line.rstrip("\r\n"))
        for number, line in text_lines(path, "the run's metrics (jsonl)")
        if line.strip()
    ]
    kept = []
    for index, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if index == len(lines) - 1:
                logger.warning("%s: line %d is not whole JSON (a write cut short): dropped",
                               path, number)  # fmt: skip
                continue
            raise DataError(f"{path}: line {number}: not JSON ({error.msg})") from None
        if record.get("step", 0) <= step:
            kept.append(line)
    return kept


class PeakMemory:
    """Peak memory since the last `reset()`: CUDA max allocated on GPU, process RSS on CPU.

    On Linux a CPU interval's peak is found without touching the process's own high-water mark
    (VmHWM, ru_maxrss), which `/usr/bin/time -v`, Snakemake's benchmarks and SLURM's
    accounting read for the whole run (resetting it through /proc/self/clear_refs, as fid did,
    left them the last interval's peak: 1,495 MiB for a run that peaked at 7,050). VmHWM only
    rises, so with `hwm0` its value at `reset()`:
    - if VmHWM > hwm0 when the peak is read, the resident size reached a new lifetime high
      within the interval, and the interval's peak is that VmHWM, exactly;
    - else the interval's peak is the largest resident size (VmRSS, /proc/self/statm) that a
      daemon thread sampled every `sample_s` seconds since `reset()`, or the current one: a
      peak that rose and fell between two samples is missed (at 20 ms, a few of a training
      step's hundreds of milliseconds at least).
    Elsewhere the process-lifetime peak (ru_maxrss) is reported.
    """

    def __init__(self, device: torch.device, sample_s: float = 0.02):
        self.device = device
        self._status = Path("/proc/self/status")
        self._statm = Path("/proc/self/statm")
        self._sampling = device.type != "cuda" and self._statm.exists()
        self._lock = threading.Lock()
        self._sampled = 0  # bytes: the largest resident size sampled since reset()
        self._hwm0: int | None = None
        self.reset()
        if self._sampling:
            # The thread holds the object weakly: it ends when the object is collected.
            self._stop = threading.Event()
            threading.Thread(target=_sample, args=(weakref.ref(self), self._stop, sample_s),
                             daemon=True, name="fid-peak-memory").start()  # fmt: skip

    def reset(self) -> None:
        if self.device.type == "cuda":
            import torch  # here, not at the top: `fid --help` and light commands skip torch

            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._sampling:
            with self._lock:
                self._hwm0 = _status_bytes(self._status, "VmHWM")
                self._sampled = _resident_bytes(self._statm)

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            import torch

            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self._sampling:
            hwm = _status_bytes(self._status, "VmHWM")
            with self._lock:
                if self._hwm0 is not None and hwm is not None and hwm > self._hwm0:
                    return hwm / 2**20  # a new lifetime high, reached in this interval
                return max(self._sampled, _resident_bytes(self._statm)) / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def close(self) -> None:
        """Stops the sampling thread (a daemon: it ends with the process anyway)."""
        if self._sampling:
            self._stop.set()

    def _take_sample(self) -> None:
        resident = _resident_bytes(self._statm)
        with self._lock:
            self._sampled = max(self._sampled, resident)


def _sample(memory: weakref.ref[PeakMemory], stop: threading.Event, sample_s: float) -> None:
    """The sampling thread's loop: until `stop` is set or the PeakMemory is gone."""
    while not stop.wait(sample_s):
        peak = memory()
        if peak is None:
            return
        peak._take_sample()
        del peak  # not held while waiting


def _resident_bytes(statm: Path) -> int:
    """The resident size (statm's second field, pages): cheaper to read than status."""
    return int(statm.read_text().split()[1]) * _PAGE_BYTES


def _status_bytes(status: Path, field: str) -> int | None:
    match = re.search(rf"{field}:\s+(\d+) kB", status.read_text())
    return int(match.group(1)) * 1024 if match else None
