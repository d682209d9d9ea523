"""Simulated out-of-memory errors, a testing aid that training and inference share: the tests
(and benchmarks/gpu/gpu_check.py) make a forward fail as if the device were smaller, to exercise
training's step recovery (fid.training.step_oom_recovery) and inference's batch halving
(fid.runtime.oom_batch_halving) on any machine.

`FID_INJECT_OOM="K:TOKENS"` makes the K-th forward of the process (counting from 1, redone ones
too; an inference command counts its batches' forwards, training its micro-batches') and every
later one raise `torch.OutOfMemoryError` when it holds more than TOKENS tokens: a device that
from then on holds TOKENS tokens. `FID_INJECT_OOM="K:TOKENS:RANK"` does so on that rank only.
Read once per run (`Injection.from_env`); never set it for real runs. Training counts a
micro-batch's tokens as its `TrainTask.item_tokens`; inference counts a batch's real (not
padding) input tokens, the sum of its attention mask: for the reader every passage slot's
question, title and passage tokens after truncation; for the retriever each passage's or
question's tokens after truncation, special tokens included. Padding does not count, so a
batch's count is the sum of its items' and does not change when the batch is cut.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fid.errors import ConfigError

logger = logging.getLogger(__name__)

INJECT_OOM = "FID_INJECT_OOM"


@dataclass(frozen=True)
class Injection:
    """Simulated out-of-memory errors (a testing aid: the module docstring)."""

    from_forward: int  # 1-based: the first forward that may fail
    above_tokens: int  # forwards with more tokens fail

    @classmethod
    def from_env(cls, rank: int, environ: Mapping[str, str] = os.environ) -> Injection | None:
        value = environ.get(INJECT_OOM)
        if not value:
            return None
        parts = value.split(":")
        try:
            numbers = [int(part) for part in parts]
        except ValueError:
            numbers = []
        if len(numbers) not in (2, 3) or numbers[0] < 1 or numbers[1] < 0:
            raise ConfigError(
                f"{INJECT_OOM}={value!r}: expected K:TOKENS or K:TOKENS:RANK (K >= 1, TOKENS "
                f">= 0). Hint: it is a testing aid; unset it"
            )
        if len(numbers) == 3 and numbers[2] != rank:
            return None
        logger.warning("%s=%s: simulated out-of-memory errors (a testing aid)", INJECT_OOM, value)
        return cls(numbers[0], numbers[1])

    def check(self, forward: int, tokens: int) -> None:
        """Raises `torch.OutOfMemoryError` for the `forward`-th forward (1-based) of `tokens`
        tokens when this injection makes it fail."""
        if forward >= self.from_forward and tokens > self.above_tokens:
            raise torch.OutOfMemoryError(
                f"{INJECT_OOM}: forward {forward}, {tokens} tokens > {self.above_tokens}"
            )


__all__ = ["INJECT_OOM", "Injection"]
