"""The cross-attention position bias of transformers 3 on a T5 decoder: a released FiD reader
imported with `--keep-cross-attention-bias` (fid/models/convert.py explains it) keeps it in its
first decoder block, and T5Stack shares it with every decoder layer, as the original's did.

Here: its key in a state dict, whether a model has it, and how a model is given it (with the
query positions transformers 3 used, cache or not).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import T5ForConditionalGeneration
from transformers.models.t5.modeling_t5 import T5Attention

# The first decoder block's cross-attention bias in state dicts (a released reader's, and a
# converted one's that keeps it).
CROSS_ATTENTION_BIAS = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"


def first_cross_attention(t5: T5ForConditionalGeneration) -> nn.Module:
    """The first decoder block's cross-attention: the one that holds a kept bias."""
    return t5.decoder.block[0].layer[1].EncDecAttention


def has_cross_attention_bias(t5: T5ForConditionalGeneration) -> bool:
    """Whether the first decoder block's cross-attention has a relative position bias."""
    return bool(first_cross_attention(t5).has_relative_attention_bias)


class _KeptBiasCrossAttention(T5Attention):
    """The first decoder block's cross-attention with transformers 3's position bias, each
    query at its own decoder position t, cache or not.

    transformers 5's T5Attention places a biased attention's queries after the cache's length;
    in cross-attention that length is the self-attention cache's, which this block's
    self-attention has already extended by the call's own tokens: under a cache (generation)
    every query sat query_length positions late (step t at t + 1), without one (training,
    scoring) right. The original's cached and uncached passes both put step t at t.
    """

    def compute_bias(self, query_length, key_length, device=None, past_seen_tokens=0):
        # past_seen_tokens: 0 without a cache, else the tokens before this call + query_length
        before = past_seen_tokens - query_length
        before = before.clamp(min=0) if isinstance(before, torch.Tensor) else max(before, 0)
        return super().compute_bias(query_length, key_length, device, before)


def add_cross_attention_bias(t5: T5ForConditionalGeneration, weight: torch.Tensor) -> None:
    """Gives the first decoder block's cross-attention the relative position bias of
    transformers 3 ((buckets, heads) `weight`; unidirectional buckets, key - query position),
    which T5Stack shares with every decoder layer, as the original's did."""
    attention = first_cross_attention(t5)
    attention.__class__ = _KeptBiasCrossAttention  # its queries' positions (the class says why)
    attention.has_relative_attention_bias = True
    attention.relative_attention_bias = nn.Embedding(*weight.shape).to(weight.device)
    with torch.no_grad():
        attention.relative_attention_bias.weight.copy_(weight)
