"""The state folder of a training run, found under a state root by what the run is.

`fid train-reader --state-root ROOT` (and train-retriever) trains in `ROOT/<key>/`, where the key
hashes what makes two runs the same run: the kind of model, every config key that resume refuses
to change (`resume.REFUSED`: data, shapes, optimisation, schedule), the content of the training
and dev files, and the model it starts from (a folder by the content of its files, a hub name
by its name). So:

- the same command run again (a retry, a SLURM requeue, a killed job) finds its state and
  resumes it, also when only cadences (`resume.WARNED`) changed;
- a run with other data, other knobs or another start model gets a fresh state, and the states
  of earlier runs are kept and listed in the log, never deleted: deleting them is the user's call.

Each state folder holds `state.json`, the record its key was made from, so that a user can tell
the states under a root apart. Rank 0 hashes the files; the other ranks receive the folder.
`--state-dir DIR` instead names the folder itself (for runs by hand).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from fid.config import config_to_dict
from fid.runtime import distributed
from fid.runtime.fileio import atomic_write_json
from fid.training.resume import REFUSED, input_fingerprints

logger = logging.getLogger(__name__)

STATE_RECORD = "state.json"
KEY_LENGTH = 16  # hex digits: 64 bits, far from any collision among a root's few states


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


def _other_states(root: Path, key: str) -> list[str]:
    described = []
    for record_file in sorted(root.glob(f"*/{STATE_RECORD}")):
        if record_file.parent.name == key:
            continue
        try:
            created = json.loads(record_file.read_text()).get("created", "?")
        except (OSError, ValueError, AttributeError):
            created = "?"
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
            created = datetime.datetime.now().isoformat(timespec="seconds")
            atomic_write_json(state / STATE_RECORD, {"key": key, "created": created, **record})
            logger.info("new training state %s", state)
        else:
            logger.info("training state %s (resumed if it holds a checkpoint)", state)
        others = _other_states(root, key)
        if others:
            logger.warning(
                "other training states under %s, kept (other data, knobs or start model; "
                "delete them when they are no longer needed): %s",
                root, "; ".join(others),
            )  # fmt: skip
    return Path(distributed.broadcast_object(None if state is None else str(state)))
