"""The state folder of a training run: found under a state root by what the run is, resumed
while its run is unfinished, and set aside once that run has exported its model.

`fid train-reader --state-root ROOT` (and train-retriever) trains in `ROOT/<key>/`, where the key
hashes what makes two runs the same run: the kind of model, every config key that resume refuses
to change (`resume.REFUSED`: data, shapes, optimisation, schedule), the content of the training
and dev files, and the model it starts from (a folder by the content of its files, a hub name
by its name). So:

- the same command run again after the run was stopped (a retry, a SLURM requeue, a killed or
  preempted job, one killed while it exported) finds its state and resumes it, also when only
  cadences (`resume.WARNED`) changed;
- a run with other data, other knobs or another start model gets a fresh state, and the states
  of earlier runs are kept and listed in the log, never deleted: deleting them is the user's call.

A state exists to resume an unfinished run. Each run that starts in a state gets a run id
(`run.json`, kept by every resume of it, written into the exported `train_config.yaml`), and
once it has exported its model it marks the state finished (`finished.json`, its last act). A
finished state decides nothing more: the next run there (`snakemake --forcerun`, an output
deleted by hand) moves the finished run's files into `finished/<run id>/` in the same folder,
kept, and trains from the start under a new id. The lock file, `state.json` and `train.log` (the
log of every run of the state) stay where they are, so the move happens under the run's lock
and no other run can be in the folder meanwhile (`state_lock`). A killed run never wrote the
marker, so it resumes, whether it stopped in its loop or while it exported.

Each state folder holds `state.json`, the record its key was made from, so that a user can tell
the states under a root apart. Rank 0 hashes the files and decides; the other ranks receive the
folder and the run id. `--state-dir DIR` instead names the folder itself (for runs by hand).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
import secrets
from pathlib import Path
from typing import Any

from fid.config import config_to_dict
from fid.runtime import distributed
from fid.runtime.fileio import atomic_write_json
from fid.training.checkpoint import step_checkpoints
from fid.training.resume import REFUSED, input_fingerprints
from fid.training.state_lock import LOCK_FILE

logger = logging.getLogger(__name__)

STATE_RECORD = "state.json"
RUN_RECORD = "run.json"  # the id of the run that trains (or trained) in the state
FINISHED = "finished.json"  # written once that run has exported its model
FINISHED_RUNS = "finished"  # finished/<run id>/: the files of each finished run, set aside
KEY_LENGTH = 16  # hex digits: 64 bits, far from any collision among a root's few states
# The folder's own files, which stay when a finished run's files are set aside: the lock (never
# moved while held, never deleted: see state_lock), the key's record, and the log of every run
# of the state (the command may already be writing this run's lines into it).
_STAYS = {LOCK_FILE, STATE_RECORD, "train.log", FINISHED_RUNS}


def _model_identity(init_model: str | Path) -> dict[str, Any]:
    """A start model by content (each file's size and sha256) when it is a folder, else by name."""
    folder = Path(init_model).expanduser()
    if not folder.is_dir():
        return {"name": str(init_model)}
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    names = {path.relative_to(folder).as_posix(): path for path in files}
    fingerprints = input_fingerprints(names)
    return {"files": {name: f["sha256"] for name, f in fingerprints.items()}}


def state_record(
    kind: str, cfg: Any, inputs: dict[str, str | Path], init_model: str | Path
) -> dict[str, Any]:
    """What identifies a training run: see the module docstring."""
    config = {key: value for key, value in config_to_dict(cfg).items() if key in REFUSED}
    data = {name: f["sha256"] for name, f in input_fingerprints(inputs).items()}
    return {
        "kind": kind,
        "config": config,
        "inputs": data,
        "init_model": _model_identity(init_model),
    }


def state_key(record: dict[str, Any]) -> str:
    """The folder name of a run's state: a prefix of the sha256 of its canonical record."""
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def _read_record(path: Path) -> dict[str, Any] | None:
    """A small JSON record of the state: None when missing, {} when unreadable."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def _other_states(root: Path, key: str) -> list[str]:
    described = []
    for record_file in sorted(root.glob(f"*/{STATE_RECORD}")):
        if record_file.parent.name == key:
            continue
        created = str((_read_record(record_file) or {}).get("created", "?"))
        finished = _read_record(record_file.parent / FINISHED)
        if finished is not None:
            created += f", finished by run {finished.get('run_id', '?')}"
        described.append(f"{record_file.parent.name} (created {created})")
    return described


def find_state(
    root: str | Path,
    kind: str,
    cfg: Any,
    inputs: dict[str, str | Path],
    init_model: str | Path,
) -> Path:
    """The state folder of this run under `root`, created (with its record) when new.

    Args:
        root: the state root (created when missing).
        kind: "reader" or "retriever".
        cfg: the run's training config (precision resolved for the device).
        inputs: name -> data file the run trains and evaluates on.
        init_model: the model the run starts from (folder or hub name).

    Returns:
        ROOT/<key>, the same on every rank.
    """
    root = Path(root)
    state = None
    if distributed.is_main():
        record = state_record(kind, cfg, inputs, init_model)
        key = state_key(record)
        state = root / key
        if not (state / STATE_RECORD).is_file():
            atomic_write_json(state / STATE_RECORD, {"key": key, "created": _now(), **record})
            logger.info("new training state %s", state)
        else:
            logger.info("training state %s (resumed if its run is unfinished)", state)
        others = _other_states(root, key)
        if others:
            logger.warning(
                "other training states under %s, kept (other data, knobs or start model; "
                "delete them when they are no longer needed): %s",
                root, "; ".join(others),
            )  # fmt: skip
    return Path(distributed.broadcast_object(None if state is None else str(state)))


def new_run_id() -> str:
    """A fresh run id: when the run started (readable, sortable) and 6 random hex digits."""
    return f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def start_run(state_dir: str | Path) -> str:
    """The id of the run that trains in `state_dir` now; call it while holding the folder.

    Rank 0 first sets a finished run's files aside into `finished/<its id>/` (the module
    docstring says why), then reads the id of the unfinished run the state holds, which this
    run resumes, or gives a new run a new id in `run.json`. It logs which it is.

    Returns:
        The run id, the same on every rank.

    Raises:
        OSError: on every rank, when rank 0 could not move or write the state's files.
    """
    run_id, failure = None, None
    if distributed.is_main():
        try:
            run_id = _start_run(Path(state_dir))
        except OSError as error:  # told to the other ranks, raised below
            failure = error
    run_id, message = distributed.broadcast_object(
        (run_id, None if failure is None else str(failure))
    )
    if failure is not None:
        raise failure
    if message is not None:
        raise OSError(f"rank 0 could not start the run in {state_dir}: {message}")
    return run_id


def _start_run(state_dir: Path) -> str:
    finished = _read_record(state_dir / FINISHED)
    kept = None if finished is None else _set_aside(state_dir, finished)
    run_id = (_read_record(state_dir / RUN_RECORD) or {}).get("run_id")
    fresh = not isinstance(run_id, str)
    if fresh:
        run_id = new_run_id()
        atomic_write_json(state_dir / RUN_RECORD, {"run_id": run_id, "started": _now()})
    steps = step_checkpoints(state_dir)
    if kept is not None:
        logger.warning(
            "the state %s finished and was exported to %s by run %s; training again from the "
            "start as run %s (its checkpoints are kept in %s)",
            state_dir, finished.get("output", "?"), kept.name, run_id, kept,
        )  # fmt: skip
    elif steps:
        logger.info("run %s: resuming %s from step %d", run_id, state_dir, steps[-1][0])
    elif fresh:
        logger.info("run %s: new run in %s", run_id, state_dir)
    else:
        logger.info("run %s: starting again in %s (it saved no checkpoint)", run_id, state_dir)
    folder = state_dir / FINISHED_RUNS
    earlier = sorted(p.name for p in folder.iterdir() if p != kept) if folder.is_dir() else []
    if earlier:
        logger.warning(
            "earlier runs of this state, finished and kept in %s (delete them when they are no "
            "longer needed): %s",
            folder, ", ".join(earlier),
        )  # fmt: skip
    return run_id


def _set_aside(state_dir: Path, finished: dict[str, Any]) -> Path:
    """Moves a finished run's files into `finished/<its run id>/`: renames within one folder,
    `finished.json` last, so a run killed while it moves them moves the rest when started
    again (the state still reads as finished until then)."""
    name = re.sub(r"[^\w.-]", "_", str(finished.get("run_id") or "unknown"))
    kept = state_dir / FINISHED_RUNS / name
    kept.mkdir(parents=True, exist_ok=True)
    for entry in sorted(state_dir.iterdir()):
        if entry.name not in _STAYS and entry.name != FINISHED:
            os.replace(entry, kept / entry.name)
    os.replace(state_dir / FINISHED, kept / FINISHED)
    return kept


def mark_finished(
    state_dir: str | Path, run_id: str, step: int, best_step: int | None, output_dir: str | Path
) -> None:
    """Marks the state finished: rank 0's last act once the run's model is exported.

    Args:
        state_dir: the run's state folder.
        run_id: the run's id (`start_run`).
        step: the step the run ended at.
        best_step: the step of the exported model.
        output_dir: where the model was exported.
    """
    record = {
        "run_id": run_id,
        "step": step,
        "best_step": best_step,
        "output": str(Path(output_dir).resolve()),
        "finished": _now(),
    }
    atomic_write_json(Path(state_dir) / FINISHED, record)
