"""FiD's encoder side: every passage encoded on its own, each question's token states fused
into the one sequence its decoder reads (FusedEncoding).

Shapes: B questions, N passage slots, L tokens per slot, T fused encoder tokens per question,
D model width.

Two exact savings over the original, which padded every passage to the maximum length:
- length buckets: the batch's real passages are sorted by length and encoded in groups, each
  padded only to its own longest passage (fid.models.bucketed_encoder runs T5's encoder over
  them);
- packing: the decoder gets only each question's real tokens, back to back (T = the sum of its
  passage lengths), because cross-attention has no position bias, so the order and spacing of
  encoder tokens do not change its result. A kept cross-attention position bias
  (fid.models.cross_attention_bias) needs the original's (B, N*L) positions instead.

FiD-Light (fid.models.reader_variants) hands the decoder only the first `light_tokens` vectors
of each passage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fid.models.bucketed_encoder import encode_buckets


@dataclass
class FusedEncoding:
    """The encoder side that the decoder reads.

    Attributes:
        hidden: (B, T, D) encoder states of each question's passages, fused.
        mask: (B, T) 1 for real tokens.
        token_passage: (B, T) the passage slot n of each token, -1 for padding.
    """

    hidden: torch.Tensor
    mask: torch.Tensor
    token_passage: torch.Tensor


def fuse_passages(
    encoder: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    encoder_buckets: int,
    pack_passages: bool,
    light_tokens: int | None,
) -> FusedEncoding:
    """Encodes every passage on its own and fuses each question's token states.

    Args:
        encoder: T5's encoder stack, with `attach_bucket_forward` applied
            (fid.models.bucketed_encoder; FiDReader's constructor does it).
        input_ids: (B, N, L) right-padded token ids.
        attention_mask: (B, N, L) 1 for real tokens.
        encoder_buckets: groups of similar-length passages encoded together; 1 = one group.
        pack_passages: the decoder gets only real tokens (B, T); False keeps the original's
            (B, N*L) layout with masked padding.
        light_tokens: FiD-Light's k, or None for every token.

    Returns:
        The fused encoding; T = longest question's token count when packing, else N*L.
        With light_tokens = k, each passage gives only its first min(length, k) tokens
        (and L becomes min(L, k) in the unpacked layout).
    """
    B, N, L = input_ids.shape
    ids = input_ids.view(B * N, L)
    mask = attention_mask.view(B * N, L).bool()
    lengths = mask.sum(dim=1)  # (B*N,)
    if not torch.equal(mask, torch.arange(L, device=mask.device) < lengths[:, None]):
        raise ValueError("passages must be right-padded: attention_mask = 1..1 0..0")
    # FiD-Light: the decoder reads positions < k of each passage (the encoder reads all).
    k = L if light_tokens is None else min(light_tokens, L)
    kept = lengths.clamp(max=k)  # (B*N,) tokens each passage hands the decoder

    # Where each passage's tokens start in its question's fused sequence.
    if pack_passages:
        per_question = kept.view(B, N)
        starts = (per_question.cumsum(dim=1) - per_question).view(B * N)  # exclusive cumsum
        T = max(int(per_question.sum(dim=1).max()), 1)
    else:
        starts = (torch.arange(N, device=ids.device) * k).repeat(B)
        T = N * k
    row_question = torch.arange(B, device=ids.device).repeat_interleave(N)  # (B*N,)
    row_slot = torch.arange(N, device=ids.device).repeat(B)  # (B*N,)

    # Encode real passages in buckets of similar length, each padded to its own longest.
    real_rows = torch.nonzero(lengths > 0).squeeze(1)
    real_rows = real_rows[torch.argsort(lengths[real_rows], stable=True)]
    buckets = torch.tensor_split(real_rows, min(encoder_buckets, len(real_rows)))
    bucket_masks = [mask[rows, : int(lengths[rows].max())] for rows in buckets]  # (n_k, w_k)
    # Block by block over all buckets: under FSDP each block is gathered once, not once
    # per bucket (fid.models.bucketed_encoder).
    pairs = zip(buckets, bucket_masks, strict=True)
    inputs = [(ids[rows, : m.shape[1]], m.long()) for rows, m in pairs]  # (n_k, w_k) each
    states = encode_buckets(encoder, inputs)
    hidden_parts, destinations, slots = [], [], []
    for rows, bucket_mask, state in zip(buckets, bucket_masks, states, strict=True):
        handed = bucket_mask[:, :k]  # (n_k, min(w_k, k)) the tokens the decoder reads
        row, pos = torch.nonzero(handed, as_tuple=True)
        token_rows = rows[row]
        hidden_parts.append(state[:, :k][handed])  # (tokens_k, D)
        destinations.append(row_question[token_rows] * T + starts[token_rows] + pos)
        slots.append(row_slot[token_rows])
    destination = torch.cat(destinations)
    hidden = torch.cat(hidden_parts)
    fused = hidden.new_zeros(B * T, hidden.shape[-1]).index_copy(0, destination, hidden)
    token_passage = torch.full((B * T,), -1, dtype=torch.long, device=ids.device)
    token_passage[destination] = torch.cat(slots)
    fused_mask = (token_passage >= 0).view(B, T).long()
    return FusedEncoding(
        hidden=fused.view(B, T, -1), mask=fused_mask, token_passage=token_passage.view(B, T)
    )
