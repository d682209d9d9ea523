"""Passage scores read from a T5 decoder's cross-attention (the teacher of FiD-KD, and what
accelerated generation keeps passages by): forward hooks record each layer's cross-attention
query and key projections, and `scores_from_projections` turns them into one score a passage.

Izacard & Grave 2021, "Distilling Knowledge from Reader to Retriever for Question Answering"
(https://arxiv.org/abs/2012.04584). Shapes: B questions, N passage slots, T fused encoder
tokens, H heads, dk the head width.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import T5ForConditionalGeneration

from fid.models.fused_encoding import FusedEncoding
from fid.models.reader_variants import has_cross_attention


def scores_from_projections(
    captured: list[dict], encoding: FusedEncoding, N: int, H: int, mode: str
) -> torch.Tensor:
    """(B, N) passage scores from each layer's cross-attention q (B, 1, H*dk), k (B, T, H*dk)."""
    B, T = encoding.mask.shape
    real = encoding.mask.bool()  # (B, T)
    layer_scores = []
    for layer in captured:
        q = layer["q"].float().view(B, 1, H, -1).transpose(1, 2)  # (B, H, 1, dk)
        k = layer["k"].float().view(B, T, H, -1).transpose(1, 2)  # (B, H, T, dk)
        logits = (q @ k.transpose(-1, -2)).squeeze(2)  # (B, H, T)
        if mode == "attention_mass":
            logits = logits.masked_fill(~real[:, None, :], float("-inf")).softmax(dim=-1)
        layer_scores.append(logits.mean(dim=1))  # (B, T), mean over heads
    per_token = torch.stack(layer_scores).mean(dim=0)  # (B, T), mean over layers
    per_token = per_token.masked_fill(~real, 0.0)

    slot = encoding.token_passage.clamp(min=0)  # padding adds 0 to slot 0
    sums = per_token.new_zeros(B, N).scatter_add_(1, slot, per_token)
    if mode == "attention_mass":
        return sums
    counts = per_token.new_zeros(B, N).scatter_add_(1, slot, real.float())
    return sums / counts


@contextlib.contextmanager
def capture_cross_attention(t5: T5ForConditionalGeneration) -> Iterator[list[dict]]:
    """Records, per decoder layer, the cross-attention query and key projections.

    Forward hooks on the `q` and `k` linear layers of each EncDecAttention (no patching of
    transformers code, any attention implementation). Yields one dict per layer with
    cross-attention (a FiDO decoder's other layers have none) that a decoder call fills with
    "q" (B, 1, H*dk) and "k" (B, T, H*dk).
    """
    blocks = [block for block in t5.decoder.block if has_cross_attention(block)]
    captured: list[dict] = [{} for _ in blocks]
    handles = []
    for block, store in zip(blocks, captured, strict=True):
        attention = block.layer[1].EncDecAttention
        handles.append(attention.q.register_forward_hook(_store_output(store, "q")))
        handles.append(attention.k.register_forward_hook(_store_output(store, "k")))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _store_output(store: dict, name: str):
    def hook(module, inputs, output):
        store[name] = output.detach()

    return hook
