"""A training run end to end: its state folder held, trained or resumed, the best model exported.

`train_and_export` is what `fid train-reader` and `fid train-retriever` run once their task is
built: the data files are fingerprinted into the run's record, the state folder is held for
the whole run, the run gets its id (a finished run's files are set aside first, so that only an
unfinished run is resumed: fid.training.states), the loop trains (resuming what the state
holds), rank 0 exports best_dev and, last, marks the state finished.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch
import yaml

from fid.config import TrainingConfig, config_to_dict
from fid.errors import CheckpointError
from fid.runtime import distributed
from fid.runtime.console import CONSOLE
from fid.runtime.fileio import atomic_directory
from fid.training.loop import run_training
from fid.training.manifest import MANIFEST, read_manifest, verify_checkpoint
from fid.training.resume import input_fingerprints
from fid.training.state_lock import hold_state
from fid.training.states import mark_finished, start_run
from fid.training.task import TrainTask

logger = logging.getLogger(__name__)


def train_and_export(
    task: TrainTask,
    cfg: TrainingConfig,
    state_dir: str | Path,
    output_dir: str | Path,
    device: torch.device,
    precision: str,
    inputs: dict[str, str | Path] | None = None,
) -> dict:
    """Runs (or resumes) training, then rank 0 exports best_dev to `output_dir`.

    The run holds `state_dir` throughout (`state_lock.hold_state`): a second run on it ends
    at once, and the leftovers of killed runs are swept from it and beside `output_dir`.
    A state whose run finished is not resumed: its files are set aside and a new run starts
    (`states.start_run`). `inputs` (name -> data file) are fingerprinted by content into the
    run's record, so a resume on other data is refused; the exported `train_config.yaml` keeps
    them as provenance, with the run id.

    Returns:
        The run id, and the exported model's step and dev metric.

    Raises:
        StateInUse: when another run holds `state_dir`.
    """
    record = config_to_dict(cfg)
    if inputs:
        fingerprints = input_fingerprints(inputs) if distributed.is_main() else None
        record["inputs"] = distributed.broadcast_object(fingerprints)  # hashed once per run
    with hold_state(state_dir, output_dir):
        run_id = start_run(state_dir)
        record = {"run_id": run_id, **record}  # in every checkpoint and the exported model
        progress = run_training(task, cfg, state_dir, device, precision, record)
        if distributed.is_main():
            export_best_model(state_dir, output_dir, record)
            # Last: a run killed before this line resumes (and exports) when started again.
            mark_finished(state_dir, run_id, progress.step, progress.best_step, output_dir)
        distributed.barrier()
    logger.info(
        "run %s: exported the best dev model (step %s, %s %.2f%%) to %s",
        run_id, progress.best_step, task.dev_metric, progress.best_metric, output_dir,
        extra=CONSOLE,
    )  # fmt: skip
    return {
        "run_id": run_id,
        "best_step": progress.best_step,
        task.dev_metric: progress.best_metric,
    }


def export_best_model(state_dir: str | Path, output_dir: str | Path, record: dict) -> None:
    """Writes best_dev, with the run's metrics.jsonl and config, atomically to `output_dir`."""
    state_dir = Path(state_dir)
    best = state_dir / "best_dev"
    if read_manifest(best) is None:  # a state from before best_dev was sealed
        logger.warning("%s has no %s (written by an older fid): exported unverified", best,
                       MANIFEST)  # fmt: skip
    else:
        try:
            verify_checkpoint(best)
        except CheckpointError as error:
            raise CheckpointError(
                f"{error}: the best dev model is damaged and was not exported to {output_dir}. "
                f"Hint: restore {best} from a backup, or train again in a new state folder"
            ) from None
    with atomic_directory(output_dir) as tmp:
        shutil.copytree(best, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(MANIFEST))
        shutil.copy(state_dir / "metrics.jsonl", tmp / "metrics.jsonl")
        (tmp / "train_config.yaml").write_text(yaml.safe_dump(record, sort_keys=False))
