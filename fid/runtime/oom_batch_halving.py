"""An inference batch that runs out of device memory is redone in halves (`BatchSplitter`).

Training redoes a whole optimizer step in smaller micro-batches (fid.training.step_oom_recovery,
which frees the failed attempt's memory with this module's `free_memory`). Inference
(`fid score-passages`, `fid eval-reader`, `fid embed-passages`, the question encoding of
`fid retrieve`) has no step to redo: each batch's outputs depend on that batch only, so
`BatchSplitter` redoes just the batch that ran out of memory. When a batch raises
`torch.OutOfMemoryError`, the error and the failed forward's tensors are dropped (out of the
`except` block, then `gc.collect()` and, on CUDA, `torch.cuda.empty_cache()`), the batch is cut
in two halves of items (the first holds the odd one) and the halves are run, each cut again if
it too fails. The batch size (items per forward) is lowered to the larger half's for the rest
of the run: every later batch (and what is left of this one) is cut into pieces within it of
about equal sizes. Each lowering is one WARNING naming the command and the old and new size.
Each piece is a contiguous run of the batch's items and its outputs go to the same places, so
the outputs are the unsplit run's: equal where the computation does not depend on the batch's
padding, within float32 round-off where it does (a piece may be padded shorter than the batch
it came from); tests/test_inference_oom.py says which. Nothing is written until every batch
has run, so a run that fails writes nothing.

One item (a question with its passages, or one passage) that alone runs out of memory ends the
run with `ItemDoesNotFit`, naming the item and its tokens (exit status 1, nothing written).

Each rank splits its own batches: inference ranks run their shares apart and meet only to
gather the outputs at the end. Where they run every forward together (a sharded model's dev
evaluation in training, `distributed.every_rank_does_all`) the error is not recovered: a rank
that redid a forward alone would leave the others inside its collectives.

Simulated failures for tests (`FID_INJECT_OOM`, shared with training): fid.runtime.oom_injection.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import torch

from fid.errors import InputError
from fid.runtime import distributed
from fid.runtime.oom_injection import Injection

logger = logging.getLogger(__name__)

Item = TypeVar("Item")


def free_memory(device: torch.device) -> None:
    """After an out-of-memory error (once its `except` block is left): the tensors of the failed
    attempt collected and, on CUDA, the cached blocks released, so that the redo may allocate
    them in other sizes (an inference batch's halves here, a training step's smaller
    micro-batches in fid.training.step_oom_recovery)."""
    gc.collect()  # a cycle through the failed attempt's frames would hold its tensors
    if device.type == "cuda":
        torch.cuda.empty_cache()


class ItemDoesNotFit(InputError):
    """One item of an inference batch (a question, a passage) ran out of memory alone."""


def halves(items: Sequence[Item]) -> tuple[Sequence[Item], Sequence[Item]]:
    """A batch cut in two contiguous halves of items, the first holding the odd one."""
    assert len(items) >= 2, "one item cannot be halved"
    cut = (len(items) + 1) // 2
    return items[:cut], items[cut:]


class BatchSplitter(Generic[Item]):
    """Runs an inference command's batches, each cut in two when it runs out of memory (the
    module docstring).

    Args:
        command: the command, for messages ("eval-reader").
        device: where the forwards run (empty_cache on CUDA).
        describe: an item as messages name it ("question 'dev-3'", "passage '17'").
        injection: simulated failures (`Injection.from_env`, read by the command), or None.
        limit: the most items a forward holds (the command's batch size, at first).
    """

    def __init__(
        self,
        command: str,
        device: torch.device,
        describe: Callable[[Item], str],
        limit: int,
        injection: Injection | None = None,
    ):
        self.command = command
        self.device = device
        self.describe = describe
        self.injection = injection
        self.limit = limit
        self.forwards = 0

    def run(
        self,
        batches: Iterable[Sequence[Item]],
        prepare: Callable[[Sequence[Item]], Any],
        forward: Callable[[Any], Any],
    ) -> Iterator[tuple[Sequence[Item], Any]]:
        """(piece, its outputs) for every piece of every batch, in order.

        Args:
            batches: the batches of items, as the command made them.
            prepare: items -> their inputs, on the CPU (tokenized; no device memory), holding
                an `attention_mask` tensor (an attribute or a key) whose sum is their tokens.
            forward: inputs -> outputs, the device's work, outputs back on the CPU (so that
                an out-of-memory error belongs to it and nothing of it is held afterwards).

        Raises:
            ItemDoesNotFit: when one item ran out of memory alone.
        """
        for batch in batches:
            pending = self._cut(batch)
            while pending:
                piece = pending.pop(0)
                inputs = prepare(piece)
                tokens = _tokens(inputs)
                failed, outputs = False, None
                try:
                    self.forwards += 1
                    if self.injection is not None:
                        self.injection.check(self.forwards, tokens)
                    outputs = forward(inputs)
                except torch.OutOfMemoryError:
                    if distributed.in_lockstep():
                        raise  # the other ranks are inside this forward's collectives
                    failed = True
                # Out of the except block the error, its traceback and the frames that held
                # the failed forward's tensors are gone.
                if not failed:
                    yield piece, outputs
                    continue
                del inputs
                free_memory(self.device)
                if len(piece) == 1:
                    raise ItemDoesNotFit(self._stuck_message(piece[0], tokens))
                self._lower_limit(len(piece), len(halves(piece)[0]), tokens)
                # the piece in halves, and the batch's pieces not run yet within the new size
                pending = [cut for rest in [piece, *pending] for cut in self._cut(rest)]

    def _cut(self, batch: Sequence[Item]) -> list[Sequence[Item]]:
        """The batch in contiguous pieces of at most `limit` items, of about equal sizes."""
        if not batch:
            return []
        n = -(-len(batch) // self.limit)  # pieces
        size, extra = divmod(len(batch), n)
        starts = [i * size + min(i, extra) for i in range(n + 1)]
        return [batch[a:b] for a, b in zip(starts, starts[1:], strict=False)]

    def _lower_limit(self, size: int, new: int, tokens: int) -> None:
        old = self.limit
        self.limit = min(old, new)  # (pieces are within the limit: new < old)
        logger.warning(
            "%s: out of memory in a batch of %d (%d tokens); the batch size goes from %d to %d "
            "for the rest of the run, and the batch is redone in two halves",
            self.command, size, tokens, old, self.limit,
        )  # fmt: skip

    def _stuck_message(self, item: Item, tokens: int) -> str:
        return (
            f"{self.command}: {self.describe(item)} ({tokens} tokens) alone ran out of memory "
            "(a batch of one); nothing was written. Hint: shorter inputs (the config's "
            "passage_max_tokens, n_passages or question_max_tokens), bf16, or a device with "
            "more memory"
        )


def _tokens(inputs: Any) -> int:
    """The real tokens of a forward's inputs: the sum of their attention mask."""
    mask = inputs["attention_mask"] if isinstance(inputs, Mapping) else inputs.attention_mask
    return int(mask.sum())


__all__ = ["BatchSplitter", "ItemDoesNotFit", "free_memory", "halves"]
