"""Answer generation by a FiD reader over a question set (greedy or beam search).

Questions are processed in batches of similar total length (fid.inference.batching), so little
padding is wasted; answers come back in the input order. A batch that runs out of memory is
redone in two halves, the same answers (fid.runtime.oom_batch_halving).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from fid.data.examples import Example
from fid.data.reader_batches import ReaderCollator
from fid.inference.accelerated_generation import accelerated_generate
from fid.inference.batching import counted, length_sorted_batches
from fid.models.reader import FiDReader
from fid.runtime.oom_batch_halving import BatchSplitter
from fid.runtime.oom_injection import Injection

logger = logging.getLogger(__name__)


def generate_answers(
    reader: FiDReader,
    tokenizer,
    collator: ReaderCollator,
    examples: Sequence[Example],
    batch_size: int,
    max_new_tokens: int,
    num_beams: int,
    device: torch.device,
    acceleration=None,
    command: str = "generate",
    injection: Injection | None = None,
) -> list[str]:
    """Generated answer strings, one per example, in input order.

    `acceleration`: an EvalReaderConfig whose passage pruning or token elimination is on
    (fid.inference.accelerated_generation), or None for plain generation. A batch out of
    memory is redone in halves, the batch size lowered for the rest of the run
    (fid.runtime.oom_batch_halving; `command` names the run in its warning, `injection`:
    simulated failures).
    """
    predictions: list[str | None] = [None] * len(examples)
    accelerated = acceleration is not None and acceleration.accelerated

    def prepare(indices):
        return collator([examples[i] for i in indices])

    def forward(batch):
        batch = batch.to(device)
        if accelerated:
            output = accelerated_generate(
                reader, batch.input_ids, batch.attention_mask, max_new_tokens, acceleration
            )
        else:
            output = reader.generate(
                batch.input_ids, batch.attention_mask, max_new_tokens, num_beams
            )
        return output.cpu()

    splitter = BatchSplitter(
        command, device, lambda i: f"question {examples[i].id!r}", batch_size, injection
    )
    batches = counted(length_sorted_batches(collator, examples, batch_size), "generate", logger)
    for indices, output in splitter.run(batches, prepare, forward):
        for i, text in zip(indices, decode_answers(tokenizer, output), strict=True):
            predictions[i] = text
    return predictions


def decode_answers(tokenizer, output) -> list[str]:
    """Generated ids (B, T) as answers, decoded as the original decoded them: special tokens
    skipped, then transformers 3.0.2's default clean-up ("cairo , illinois" -> "cairo,
    illinois"; the tokenizer's own `clean_up_tokenization`), applied here for every
    tokenizer: their own defaults differ across models and versions, and transformers 5
    ignores the flag for BPE tokenizers; surrounding spaces stripped."""
    texts = tokenizer.batch_decode(output, skip_special_tokens=True,
                                   clean_up_tokenization_spaces=False)  # fmt: skip
    return [tokenizer.clean_up_tokenization(text).strip() for text in texts]
