"""A training step that runs out of memory is redone in smaller micro-batches.

When a forward or backward of a step raises `torch.OutOfMemoryError`, the step's partial
gradients are dropped, the memory they and the failed graph held is freed, the RNG states are
set back to the step's start, and the run's micro-batch token limit is lowered to half the
tokens of the micro-batch that failed. The WHOLE step is then redone with every micro-batch
above the limit split in two by tokens (again, until each piece is within the limit or is one
question): `accumulate_gradients` weighs each piece by its items, so the gradient is still the
union's (equal to the unsplit step's within round-off when nothing draws random numbers), and
the step consumes the same data. It repeats, halving, until the step fits.

The limit holds for the rest of the run (a WARNING names the step and the old and new limit)
and is saved in every checkpoint (`TrainingProgress.micro_batch_token_limit`), so a resumed run
splits exactly as the run that was not stopped, and ends bitwise equal to it.

A piece that cannot be split (one question; a retriever micro-batch whose questions are each
other's in-batch negatives) and still runs out of memory ends the run with
`MicroBatchDoesNotFit`, naming its question ids, tokens and the limit; nothing is written, so
the last checkpoint stays the state the same command resumes once the cause is fixed.

Distributed (sharding 'ddp'): every micro-batch's backward stays local, so no rank is ever
inside a collective that a rank out of memory will not join. After its last micro-batch each
rank says whether it failed (`any_rank`, one small all-reduce a step); if one did, all redo the
step with the same, lowest, limit; if none did, the loop averages the gradients once
(fid.training.replicas). FSDP over several ranks is not recovered: its forward gathers each
block's weights from every rank, so a rank that fails mid-forward leaves the others inside a
collective; the error ends the run.

Testing aid: `FID_INJECT_OOM="K:TOKENS"` makes the K-th micro-batch forward of the process
(counting from 1, redone ones too) and every later one raise `torch.OutOfMemoryError` when its
micro-batch holds more than TOKENS tokens (as `TrainTask.item_tokens` counts them): a device
that from then on holds TOKENS tokens. `FID_INJECT_OOM="K:TOKENS:RANK"` does so on that rank
only. Read once per run, here (`Injection.from_env`, fid.runtime.oom_injection, which
inference shares); never set it for real training.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fid.errors import InputError
from fid.runtime import distributed
from fid.runtime.oom_batch_halving import free_memory
from fid.runtime.oom_injection import Injection
from fid.training.checkpoint import TrainingProgress, rng_state, set_rng_state
from fid.training.task import TrainTask

logger = logging.getLogger(__name__)

__all__ = ["MicroBatchDoesNotFit", "StepRecovery", "fit", "halve"]


class MicroBatchDoesNotFit(InputError):
    """A micro-batch that cannot be split further ran out of memory."""


class _GuardedTask:
    """The task as `accumulate_gradients` sees it during a step: it remembers the micro-batch
    whose forward ran last (the one a forward or backward out of memory belongs to) and
    injects simulated failures."""

    def __init__(self, task: TrainTask, injection: Injection | None):
        self.task = task
        self.injection = injection
        self.forwards = 0
        self.current: Any = None

    def loss(self, model: nn.Module, item: Any) -> torch.Tensor:
        self.current = item
        self.forwards += 1
        injection = self.injection
        if injection is not None and self.forwards >= injection.from_forward:
            injection.check(self.forwards, self.task.item_tokens(item))
        return self.task.loss(model, item)

    def loss_items(self, item: Any) -> int:
        return self.task.loss_items(item)


@dataclass(frozen=True)
class _Failure:
    """A rank's micro-batch that ran out of memory (picklable: the ranks exchange it)."""

    rank: int
    tokens: int
    splittable: bool
    question_ids: list[str]


class StepRecovery:
    """Runs the optimizer steps of one run, each redone in smaller pieces when it runs out of
    memory (the module docstring). The limit lives in `progress`, which checkpoints save.

    Args:
        task: the trained task (its `item_tokens`, `split`, `question_ids`).
        progress: the run's progress; its `micro_batch_token_limit` is read and lowered.
        device: this rank's device (empty_cache on CUDA; the flag's all-reduce).
        recoverable: False where a failure cannot be coordinated (FSDP over several ranks):
            steps then run as they are, and the error propagates.
    """

    def __init__(
        self, task: TrainTask, progress: TrainingProgress, device: torch.device, recoverable: bool
    ):
        self.task = task
        self.progress = progress
        self.device = device
        self.recoverable = recoverable
        self.rank = distributed.world()[0]
        self.guarded = _GuardedTask(task, Injection.from_env(self.rank))

    def run(
        self,
        step: int,
        batches: Sequence[Any],
        accumulate: Callable[[Any, list[Any]], torch.Tensor],
        parameters: Sequence[nn.Parameter],
    ) -> torch.Tensor:
        """One step's forward and backward passes, redone until they fit.

        Args:
            step: the step's number (1-based), for messages.
            batches: this rank's micro-batches of the step.
            accumulate: (task, micro-batches) -> the step's loss, gradients accumulated
                locally (no collective inside but the items' count, on every rank alike).
            parameters: the trained parameters (their gradients are dropped on a failure).

        Returns:
            What `accumulate` returned for the attempt that fitted on every rank.

        Raises:
            MicroBatchDoesNotFit: on every rank, when a piece that cannot be split ran out of
                memory on some rank.
        """
        if not self.recoverable:
            return accumulate(self.task, list(batches))
        snapshot = rng_state()  # dropout's draws of a redone step are the first attempt's
        while True:
            pieces = fit(self.task, batches, self.progress.micro_batch_token_limit)
            loss, failure = None, None
            self.guarded.current = None
            try:
                loss = accumulate(self.guarded, pieces)
            except torch.OutOfMemoryError:
                if self.guarded.current is None:
                    raise  # outside any micro-batch (the items' count): nothing to split
                failure = self._failure(self.guarded.current)
            # Out of the except block the error, its traceback and the frames holding the
            # failed graph are gone; nothing from the attempt is left but the gradients.
            if not distributed.any_rank(failure is not None, self.device):
                return loss
            self._free(parameters)
            self._lower_limit(step, distributed.all_gather_objects(failure))
            set_rng_state(snapshot)

    def _failure(self, item: Any) -> _Failure:
        return _Failure(
            rank=self.rank,
            tokens=self.task.item_tokens(item),
            splittable=len(self.task.split(item)) > 1,
            question_ids=self.task.question_ids(item),
        )

    def _free(self, parameters: Sequence[nn.Parameter]) -> None:
        for parameter in parameters:
            parameter.grad = None
        self.guarded.current = None
        free_memory(self.device)

    def _lower_limit(self, step: int, failures: list[_Failure | None]) -> None:
        """Every rank alike, from every rank's failure."""
        failed = [f for f in failures if f is not None]
        old = self.progress.micro_batch_token_limit
        stuck = next((f for f in failed if not f.splittable), None)
        if stuck is not None:
            raise MicroBatchDoesNotFit(_stuck_message(step, stuck, old, len(failures)))
        smallest = min(failed, key=lambda f: f.tokens)  # the ranks' limit: half of it
        new = max(1, smallest.tokens // 2)
        if old is not None:
            new = min(new, old)
        self.progress.micro_batch_token_limit = new
        logger.warning(
            "step %d: out of memory in a micro-batch of %d tokens (rank %d); the micro-batch "
            "token limit goes from %s to %d for the rest of the run (saved with its "
            "checkpoints); the step is redone with the micro-batches above it split in two",
            step, smallest.tokens, smallest.rank, "none" if old is None else old, new,
        )  # fmt: skip


def _stuck_message(step: int, failure: _Failure, limit: int | None, ranks: int) -> str:
    where = f" on rank {failure.rank}" if ranks > 1 else ""
    if len(failure.question_ids) == 1:
        what = f"question {failure.question_ids[0]!r} ({failure.tokens} tokens) alone"
    else:
        what = (
            f"a micro-batch of questions {failure.question_ids} ({failure.tokens} tokens), "
            "which cannot be split (each is the others' in-batch negatives),"
        )
    return (
        f"step {step}: {what} ran out of memory{where} at a micro-batch token limit of "
        f"{'none' if limit is None else limit}; the last checkpoint is kept. Hint: a reader's "
        "activation_checkpointing: true resumes the same run in less memory; a smaller "
        "passage_max_tokens, n_passages or batch_size_per_device, or bf16, needs a new state "
        "folder (or a device with more memory)"
    )


def fit(task: TrainTask, items: Sequence[Any], limit: int | None) -> list[Any]:
    """The micro-batches with each above `limit` tokens split in two, recursively, until every
    piece is within it or cannot be split; in order. Without a limit: `items` as they are."""
    if limit is None:
        return list(items)
    pieces = []
    for item in items:
        halves = task.split(item) if task.item_tokens(item) > limit else [item]
        pieces.extend(fit(task, halves, limit) if len(halves) > 1 else halves)
    return pieces


def halve(counts: Sequence[int]) -> int:
    """Where to cut a micro-batch of questions with these token counts (in order) into two
    non-empty halves of about equal tokens: the number of questions in the first half."""
    assert len(counts) >= 2, "one question cannot be halved"
    total, before = sum(counts), 0
    best, best_gap = 1, None
    for cut in range(1, len(counts)):
        before += counts[cut - 1]
        gap = abs(total - 2 * before)
        if best_gap is None or gap < best_gap:
            best, best_gap = cut, gap
    return best
