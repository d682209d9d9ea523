"""T5's encoder over several length buckets: block by block, or bucket by bucket in inference.

The reader encodes a batch's passages in buckets of similar length (FiDReader.encode). Bucket by
bucket through T5's encoder stack, every block runs once per bucket, and under FSDP each run is
a forward of the block's unit: 8 buckets all-gathered each block 8 times in the forward and 8
times again in the backward (counted on 2 gloo ranks: 18 all-gathers instead of 4 for a 2 + 2
block reader). So the loop is turned around: each block takes every bucket in one call,
`forward_buckets`, which an FSDP unit treats as its forward (fid.training.sharding registers
it): a block is gathered once in the forward and once in the backward, and its gradient
reduce-scattered once.

Training runs block by block sharded or not, so that dropout draws the same numbers in the same
order under FSDP as under DDP (the two train the same model: tests/test_training_matrix.py).
Without gradients block by block costs memory: every bucket's (n_k, H, w_k, w_k) position bias
(mask included) and mask live through the whole stack, where bucket by bucket holds one
bucket's at a time: the memory plan's trace of the tiny generation of
tests/test_inference_plan.py peaks 24% higher block by block, while at t5-base's shape (N = 100,
L = 250, 8 buckets) the peak, after the encoder, is the same. A training step keeps them anyway
(a checkpointed block's inputs; its real peak was 7% lower block by block at the tiny shapes of
tests/test_memory_plan.py). So an unsharded reader's inference (generation, scoring) keeps the
bucket-by-bucket order; the memory plans trace the order the run takes.

Block by block keeps the stack's own steps as T5Stack.forward takes them for an encoder
(transformers 5): embedding, the bidirectional mask, dropout, the blocks (the first block's
relative position bias, mask included, handed to the next ones), the final norm and dropout.
Each bucket's tensors are those of its own encoder call; only dropout draws its random numbers
in another order.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MethodType

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers.masking_utils import create_bidirectional_mask

# The name FSDP registers as a unit's second forward method (fid.training.sharding.shard).
BUCKETS_METHOD = "forward_buckets"


def attach_bucket_forward(stack: nn.Module) -> None:
    """Gives each block of T5's encoder stack its all-buckets call, `forward_buckets`."""
    for block in stack.block:
        setattr(block, BUCKETS_METHOD, MethodType(_forward_buckets, block))


def _forward_buckets(
    block: nn.Module,
    states: list[torch.Tensor],
    masks: list[torch.Tensor | None],
    biases: list[torch.Tensor | None],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One T5 block over every bucket.

    Args:
        states: a (n_k, w_k, D) hidden state per bucket k.
        masks: each bucket's attention mask as T5Stack builds it (None: no padding).
        biases: each bucket's position bias from the first block (None before it).

    Returns:
        The buckets' new states and position biases ((1 or n_k, H, w_k, w_k), mask included).

    `block.forward`, not `block(...)`: module hooks (FSDP's) run once around this whole call;
    transformers' activation checkpointing is in `forward` itself, so each bucket is still
    checkpointed on its own.
    """
    outputs = [block.forward(h, m, b) for h, m, b in zip(states, masks, biases, strict=True)]
    return [out[0] for out in outputs], [out[1] for out in outputs]


def encode_buckets(
    stack: nn.Module,
    buckets: list[tuple[torch.Tensor, torch.Tensor | None]],
    block_by_block: bool | None = None,
) -> Iterator[torch.Tensor]:
    """T5's encoder stack over each (input_ids (n_k, w_k), attention_mask (n_k, w_k)) bucket.

    Args:
        block_by_block: each block over all buckets at once; None: with gradients on (training)
            or where the blocks are FSDP units (the memory plans choose it as the run will).

    Yields:
        Each bucket's last hidden state, (n_k, w_k, D), in order: what `stack(input_ids,
        attention_mask)` returns for it. One at a time, so that a caller keeping a part of each
        frees the rest before the next (bucket by bucket: before the next is computed). Block
        by block needs `attach_bucket_forward` on the stack first (FiDReader's constructor
        calls it, before any sharding).
    """
    if block_by_block is None:
        block_by_block = torch.is_grad_enabled() or isinstance(stack.block[0], FSDPModule)
    if not block_by_block:
        for ids, mask in buckets:
            yield stack(input_ids=ids, attention_mask=mask).last_hidden_state
        return
    embedded = [stack.embed_tokens(ids) for ids, _ in buckets]
    masks = [
        create_bidirectional_mask(config=stack.config, inputs_embeds=e, attention_mask=m)
        for e, (_, m) in zip(embedded, buckets, strict=True)
    ]
    states = [stack.dropout(e) for e in embedded]
    biases: list[torch.Tensor | None] = [None] * len(buckets)
    for block in stack.block:
        states, biases = getattr(block, BUCKETS_METHOD)(states, masks, biases)
    del biases, masks
    while states:
        yield stack.dropout(stack.final_layer_norm(states.pop(0)))
