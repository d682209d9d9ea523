"""Reader batches: FiD-format examples into (B, N, L) token tensors, and the batches of an epoch.

Each passage becomes the original's `question: Q title: T context: P` input, tokenized without
special tokens (the original encoded passages without EOS) and truncated; a question's top
`n_passages` passages by score fill its N slots, missing ones are masked.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fid.data.examples import Example, top_passages


def passage_text(question: str, ctx: dict[str, Any]) -> str:
    """The reader input of one passage, as in the original FiD."""
    return f"question: {question} title: {ctx['title']} context: {ctx['text']}"


@dataclass
class ReaderBatch:
    """A batch of B questions with N passage slots of at most L tokens each.

    Attributes:
        question_ids: B record ids.
        input_ids: (B, N, L) token ids, right-padded; padding slots are all padding.
        attention_mask: (B, N, L) 1 for real tokens.
        passage_mask: (B, N) True for real passages (False for slots of a question that has
            fewer than N passages).
        ctx_indices: for each question, the indices into its `ctxs` of passages 0..n-1.
        labels: (B, A) target ids with EOS, -100 where padded; None when not training.
    """

    question_ids: list[str]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    passage_mask: torch.Tensor
    ctx_indices: list[list[int]]
    labels: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> ReaderBatch:
        """The same batch with its tensors on `device`."""
        return ReaderBatch(
            question_ids=self.question_ids,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            passage_mask=self.passage_mask.to(device),
            ctx_indices=self.ctx_indices,
            labels=None if self.labels is None else self.labels.to(device),
        )

    @property
    def n_tokens(self) -> int:
        """Real passage tokens in the batch."""
        return int(self.attention_mask.sum())


class ReaderCollator:
    """Turns examples (and optional targets) into a `ReaderBatch`.

    Args:
        tokenizer: a Hugging Face tokenizer of the reader.
        n_passages: passage slots per question (top by score; missing ones are masked).
        passage_max_tokens: tokens kept per passage input (truncated beyond).
        target_max_tokens: when set, targets are padded or truncated to exactly this length.
        pad_to_max_length: pad L to `passage_max_tokens` instead of the batch's longest.
    """

    def __init__(
        self,
        tokenizer,
        n_passages: int,
        passage_max_tokens: int,
        target_max_tokens: int | None = None,
        pad_to_max_length: bool = False,
    ):
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the reader's tokenizer needs a pad token and an EOS token")
        self.tokenizer = tokenizer
        self.n_passages = n_passages
        self.passage_max_tokens = passage_max_tokens
        self.target_max_tokens = target_max_tokens
        self.pad_to_max_length = pad_to_max_length

    def _encode(self, texts: list[str], max_tokens: int) -> list[list[int]]:
        # No special tokens: the original encoded passages without EOS.
        encoded = self.tokenizer(
            texts, add_special_tokens=False, truncation=True, max_length=max_tokens
        )["input_ids"]
        return [list(ids) for ids in encoded]

    def encode_targets(self, targets: Sequence[str]) -> torch.Tensor:
        """(B, A) label ids: answer tokens + EOS, -100 where padded."""
        eos = self.tokenizer.eos_token_id
        limit = self.target_max_tokens
        rows = [
            ids[: limit - 1] + [eos] if limit else ids + [eos]
            for ids in self._encode(list(targets), max_tokens=10_000)
        ]
        width = limit or max(len(row) for row in rows)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for i, row in enumerate(rows):
            labels[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return labels

    def __call__(
        self, examples: Sequence[Example], targets: Sequence[str] | None = None
    ) -> ReaderBatch:
        ctx_indices = [top_passages(example, self.n_passages) for example in examples]
        texts = [
            passage_text(example.question, example.ctxs[i])
            for example, indices in zip(examples, ctx_indices, strict=True)
            for i in indices
        ]
        encoded = iter(self._encode(texts, self.passage_max_tokens))
        n_slots = self.n_passages
        rows = [[next(encoded) for _ in indices] for indices in ctx_indices]
        longest = max(len(ids) for row in rows for ids in row)
        length = self.passage_max_tokens if self.pad_to_max_length else longest
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(examples), n_slots, length), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), n_slots, length), dtype=torch.long)
        passage_mask = torch.zeros((len(examples), n_slots), dtype=torch.bool)
        for b, row in enumerate(rows):
            for n, ids in enumerate(row):
                input_ids[b, n, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention_mask[b, n, : len(ids)] = 1
                passage_mask[b, n] = len(ids) > 0
        return ReaderBatch(
            question_ids=[example.id for example in examples],
            input_ids=input_ids,
            attention_mask=attention_mask,
            passage_mask=passage_mask,
            ctx_indices=ctx_indices,
            labels=None if targets is None else self.encode_targets(targets),
        )

    def question_token_counts(self, examples: Sequence[Example], chunk: int = 256) -> list[int]:
        """Passage tokens each question contributes to a batch (for token-budget batching)."""
        counts = []
        for start in range(0, len(examples), chunk):
            part = examples[start : start + chunk]
            texts = [
                passage_text(example.question, example.ctxs[i])
                for example in part
                for i in top_passages(example, self.n_passages)
            ]
            lengths = iter(len(ids) for ids in self._encode(texts, self.passage_max_tokens))
            for example in part:
                n = len(top_passages(example, self.n_passages))
                counts.append(sum(next(lengths) for _ in range(n)))
        return counts


def epoch_batches(
    n_examples: int,
    batch_size: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    token_counts: Sequence[int] | None = None,
    max_tokens: int | None = None,
) -> list[list[int]]:
    """The batches of one epoch as lists of example indices, reproducible from (seed, epoch).

    With `max_tokens`, questions are grouped so that a batch's passage tokens stay within the
    budget: the epoch's shuffled order is cut into pools of ~100 batches, each pool is sorted by
    length and cut greedily (so batches hold questions of similar size), and the batches are
    shuffled again. A question longer than the budget forms a batch of its own.
    """
    order = list(range(n_examples))
    rng = random.Random(f"{seed}/epoch/{epoch}")
    if shuffle:
        rng.shuffle(order)
    if max_tokens is None:
        return [order[i : i + batch_size] for i in range(0, n_examples, batch_size)]
    if token_counts is None or len(token_counts) != n_examples:
        raise ValueError("token-budget batching needs one token count per example")
    mean = max(1.0, sum(token_counts) / max(1, n_examples))
    pool_size = max(1, math.ceil(100 * max_tokens / mean))
    batches: list[list[int]] = []
    for start in range(0, n_examples, pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: token_counts[i])
        batch: list[int] = []
        used = 0
        for index in pool:
            if batch and used + token_counts[index] > max_tokens:
                batches.append(batch)
                batch, used = [], 0
            batch.append(index)
            used += token_counts[index]
        if batch:
            batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches
