"""One question's cross-attention keys and values, projected once and shared by copies of it
that differ only in their cross-attention masks (leave-one-out scoring: FiDReader's
`leave_one_out_log_likelihoods`). Shapes: R copies, T fused encoder tokens, D model width,
H heads, dk the head width.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from transformers import T5ForConditionalGeneration

from fid.models.reader_variants import has_cross_attention


class _SharedProjection(nn.Module):
    """Stands in for a cross-attention's `k` or `v` projection while copies of one question
    are decoded: returns the question's projection, computed once, expanded over the copies."""

    def __init__(self, projected: torch.Tensor):
        super().__init__()
        self.projected = projected  # (1, T, H*dk)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        # states: (R, T, D) the copies' encoder states; -> (R, T, H*dk), a view
        return self.projected.expand(*states.shape[:-1], -1)


@contextlib.contextmanager
def shared_cross_attention(t5: T5ForConditionalGeneration, hidden: torch.Tensor) -> Iterator[None]:
    """Projects one question's encoder states `hidden` (1, T, D) to every decoder layer's
    cross-attention keys and values once, and lets every decoder call inside the block read
    them, for any number of copies of that question (encoder states (R, T, D), an expansion
    of `hidden`).

    Each cross-attention's `k` and `v` are swapped for `_SharedProjection`s and put back on
    exit: T5Attention then reshapes views of the shared projections, and the rest of T5 runs
    unchanged. (transformers' EncoderDecoderCache can hold pre-filled keys too, but a decoder
    call with a cache computes a kept cross-attention position bias from the query positions
    shifted by the self-attention cache's length: not the uncached pass.) Layers without
    cross-attention (FiDO) have nothing to share.
    """
    attentions = [
        block.layer[1].EncDecAttention for block in t5.decoder.block if has_cross_attention(block)
    ]
    originals = [(attention.k, attention.v) for attention in attentions]
    try:
        for attention in attentions:
            keys, values = attention.k(hidden), attention.v(hidden)  # (1, T, H*dk) each
            attention.k, attention.v = _SharedProjection(keys), _SharedProjection(values)
        yield
    finally:
        for attention, (k, v) in zip(attentions, originals, strict=True):
            attention.k, attention.v = k, v
