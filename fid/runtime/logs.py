"""Run logging: the console/file log, metrics.jsonl, TensorBoard scalars and peak memory
(progress lines of long loops: fid.runtime.progress).

Units: every quality metric (exact match, F1, retrieval top-k accuracy, the retriever's
candidate agreement and answer recall) is a percentage, 0-100, in every log line, metrics file
and report table; log lines label it ("EM 6.31%").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import resource
import sys
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

    On Linux the RSS peak (VmHWM) is reset through /proc/self/clear_refs, so each logging
    interval reports its own peak; elsewhere the process-lifetime peak (ru_maxrss) is reported.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._status = Path("/proc/self/status")
        self._clear_refs = Path("/proc/self/clear_refs")
        self.reset()

    def reset(self) -> None:
        import torch  # here, not at the top: `fid --help` and light commands skip torch

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
