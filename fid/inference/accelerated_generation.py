"""Faster greedy answers from an unchanged reader: passage pruning and token elimination.

At 100 passages the decoder's cross-attention reads every one of the question's T encoder
tokens (T ~ 100 x 150) in every layer at every step. Two ways to read fewer, without retraining:

- passage pruning: after the first decoding step, keep the top-k passages by that step's
  cross-attention (`FiDReader.passage_scores`' signal: what the retriever is distilled from)
  and decode the rest of the answer from their tokens only;
- token elimination (Berchansky et al. 2023, "Optimizing Retrieval-augmented Reader Models via
  Token Elimination", https://arxiv.org/abs/2310.13682): after step s, keep the top p% of each
  question's encoder tokens by step s's cross-attention probability (one layer's or the mean
  over layers, averaged over heads, optionally weighted by the value vectors' norms).

Both shrink the cross-attention cache: the keys and values that every decoder layer computed
from the encoder at the first step, (B, H, T, dk) per layer, are gathered down to the kept
tokens (B, H, T', dk), and the encoder mask with them. The first tokens are still decided over
every passage; only what follows reads fewer. T5's cross-attention has no position bias, so
the order of the kept tokens does not matter (a model with the original's bias is refused).
Unlike the paper, elimination applies to every layer from the step after the ranking one:
T5Stack shares the first layer's cross-attention bias (1, H, 1, T) with all layers, so every
layer must read the same number of tokens at a step.

The decoding loop is greedy (what FiD evaluates with) and written here because generation must
stop between steps to trim the cache; with nothing to trim it returns exactly the answers of
`FiDReader.generate` (tests/test_accelerated_generation.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from fid.config import ConfigError
from fid.models.cross_attention_bias import has_cross_attention_bias
from fid.models.cross_attention_scores import scores_from_projections
from fid.models.fused_encoding import FusedEncoding
from fid.models.reader import FiDReader


@torch.no_grad()
def accelerated_generate(
    reader: FiDReader,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    cfg,
) -> torch.Tensor:
    """Greedy answers reading fewer encoder tokens after the first steps.

    Args:
        reader: the reader (unchanged weights).
        input_ids: (B, N, L) passage token ids.
        attention_mask: (B, N, L).
        max_new_tokens: most tokens generated (EOS included).
        cfg: the knobs of `EvalReaderConfig` (keep_passages, keep_tokens, ...).

    Returns:
        (B, <= max_new_tokens + 1) ids starting with the decoder start token, padded after EOS,
        as `FiDReader.generate` returns them.
    """
    check_acceleration(reader, cfg)
    encoding = reader.encode(input_ids, attention_mask)
    return accelerated_decode(reader, encoding, input_ids.shape[1], max_new_tokens, cfg)


def check_acceleration(reader: FiDReader, cfg) -> None:
    """ConfigError for a reader the knobs cannot apply to."""
    t5 = reader.t5
    if has_cross_attention_bias(t5):
        raise ConfigError(
            "keep_passages / keep_tokens need a reader without a cross-attention position bias "
            "(this one was imported with --keep-cross-attention-bias): positions would change"
        )
    layers = len(_cross_attention_blocks(t5))
    if cfg.keep_tokens_layer is not None and cfg.keep_tokens_layer >= layers:
        raise ConfigError(
            f"keep_tokens_layer = {cfg.keep_tokens_layer} is out of range: the reader's decoder "
            f"has {layers} layers with cross-attention (expected 0 to {layers - 1})"
        )


@torch.no_grad()
def accelerated_decode(
    reader: FiDReader, encoding: FusedEncoding, N: int, max_new_tokens: int, cfg
) -> torch.Tensor:
    """The greedy loop of `accelerated_generate`, from the encoding of N passage slots."""
    t5 = reader.t5
    config = t5.config
    B = encoding.hidden.shape[0]
    device = encoding.hidden.device
    cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    tokens = torch.full((B, 1), config.decoder_start_token_id, dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    for step in range(1, max_new_tokens + 1):
        ranking = _ranks_at(step, cfg)
        within = "tokens" in ranking and cfg.keep_tokens_layer is not None
        with contextlib.ExitStack() as hooks:
            queries = hooks.enter_context(_capture_queries(t5)) if ranking else None
            if within:  # layers after keep_tokens_layer read only the kept tokens already
                cut = hooks.enter_context(
                    _eliminate_within_step(t5, cache, queries, encoding, N, cfg)
                )
            out = t5(
                encoder_outputs=BaseModelOutput(last_hidden_state=encoding.hidden),
                attention_mask=encoding.mask,
                decoder_input_ids=tokens[:, -1:],
                cache=cache,
                use_cache=True,
            )
        chosen = out.logits[:, -1].argmax(dim=-1)  # (B,)
        chosen = chosen.masked_fill(finished, config.pad_token_id)
        tokens = torch.cat([tokens, chosen[:, None]], dim=1)
        finished |= chosen == config.eos_token_id
        if finished.all():
            break
        if ranking:  # (EvalReaderConfig refuses pruning with an in-step cut at the same step)
            keep = cut.keep if within else _tokens_to_keep(
                ranking, queries, cache, encoding, N, config.num_heads, cfg
            )  # fmt: skip
            encoding = _keep_tokens(encoding, cache, keep)
    return tokens


class _WithinStep:
    """What `_eliminate_within_step` decided: `keep` (B, T) bool once the chosen layer ran."""

    keep: torch.Tensor | None = None
    order: torch.Tensor | None = None  # (B, T') kept positions first, in order
    valid: torch.Tensor | None = None  # (B, T') real kept tokens (not padding)


@contextlib.contextmanager
def _eliminate_within_step(t5, cache, queries, encoding: FusedEncoding, N: int, cfg):
    """Berchansky et al.'s elimination inside the ranking step: once cross-attention layer l
    (`keep_tokens_layer`) has run, the later layers of the same step read only the kept tokens;
    at the first step they then project keys and values of the kept tokens only, which is most
    of what the decoder saves (the first step projects every encoder token in every layer).

    Hooks: a forward hook on layer l's cross-attention sublayer ranks the tokens; a pre-hook on
    each later one swaps its inputs for the kept tokens' (encoder states (B, T', D), mask
    (B, 1, 1, T'), the shared zero position bias (1, H, 1, T')) or, where its keys and values are
    cached already (a later step), gathers the cache.
    """
    state = _WithinStep()
    blocks = _cross_attention_blocks(t5)
    layer = cfg.keep_tokens_layer
    H = t5.config.num_heads

    def rank(module, args, output):
        state.keep = _tokens_to_keep(["tokens"], queries, cache, encoding, N, H, cfg)
        state.order, state.valid = _kept_positions(state.keep)

    # each cross-attention sublayer's position among the layers that have cross-attention
    index_of = {id(block.layer[1]): i for i, block in enumerate(blocks)}

    def swap(module, args, kwargs):
        index = index_of[id(module)]
        cached = cache.cross_attention_cache.layers[index]
        if getattr(cached, "keys", None) is not None and cached.keys.numel() > 0:
            _gather_layer(cached, state.order)
        else:
            states = kwargs["key_value_states"]  # (B, T, D)
            order = state.order[:, :, None].expand(-1, -1, states.shape[-1])
            kwargs["key_value_states"] = states.gather(1, order)
        kwargs["attention_mask"] = _cut_mask(kwargs.get("attention_mask"), state, kwargs)
        bias = kwargs.get("position_bias")
        if bias is not None:  # zeros: cross-attention has no position bias here
            kwargs["position_bias"] = bias[..., : state.order.shape[1]]
        return args, kwargs

    handles = [blocks[layer].layer[1].register_forward_hook(rank)]
    for block in blocks[layer + 1 :]:
        handles.append(block.layer[1].register_forward_pre_hook(swap, with_kwargs=True))
    try:
        yield state
    finally:
        for handle in handles:
            handle.remove()


def _cut_mask(mask, state: _WithinStep, kwargs) -> torch.Tensor:
    """The encoder mask of the kept tokens, in the form the attention kernel was given: bool
    (True: attend) or additive float (0 / dtype min); built additive where there was none."""
    valid = state.valid[:, None, None, :]  # (B, 1, 1, T')
    if mask is None:
        dtype = kwargs["key_value_states"].dtype
        zeros = torch.zeros(valid.shape, dtype=dtype, device=valid.device)
        return zeros.masked_fill(~valid, torch.finfo(dtype).min)
    order = state.order[:, None, None, :].expand(mask.shape[0], *mask.shape[1:3], -1)
    cut = mask.gather(-1, order)
    if cut.dtype == torch.bool:
        return cut & valid
    return cut.masked_fill(~valid, torch.finfo(cut.dtype).min)


def _gather_layer(layer, order: torch.Tensor) -> None:
    """A cache layer's keys and values (B, H, T, dk) cut to the positions `order` (B, T')."""
    index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
    layer.keys = layer.keys.gather(2, index)
    layer.values = layer.values.gather(2, index)


def _ranks_at(step: int, cfg) -> list[str]:
    """What the cross-attention of decoding step `step` (1-based) ranks: "passages", "tokens"."""
    ranking = []
    if cfg.keep_passages is not None and step == 1:
        ranking.append("passages")
    if cfg.keep_tokens is not None and step == cfg.keep_tokens_step:
        ranking.append("tokens")
    return ranking


def _tokens_to_keep(
    ranking: list[str],
    queries: list[torch.Tensor | None],
    cache: EncoderDecoderCache,
    encoding: FusedEncoding,
    N: int,
    H: int,
    cfg,
) -> torch.Tensor:
    """(B, T) bool: the encoder tokens read from the next step on."""
    real = encoding.mask.bool()  # (B, T)
    B, T = real.shape
    keys = [layer.keys for layer in _cross_layers(cache)]  # each (B, H, T, dk)
    keep = real
    if "passages" in ranking:
        captured = [
            {"q": q, "k": k.transpose(1, 2).reshape(B, T, -1)}
            for q, k in zip(queries, keys, strict=True)
        ]
        # (B, N) the brute-force first-step score of FiDReader.passage_scores; NaN-free:
        # empty slots get -inf so that they are never among the kept ones.
        scores = scores_from_projections(captured, encoding, N, H, cfg.keep_passages_by)
        slot = encoding.token_passage.clamp(min=0)  # (B, T); padding counts 0 towards slot 0
        present = scores.new_zeros(B, N).scatter_add_(1, slot, real.to(scores.dtype)) > 0
        scores = scores.float().masked_fill(~present, float("-inf"))
        k = min(cfg.keep_passages, N)
        top = scores.topk(k, dim=1).indices  # (B, k)
        kept_slots = torch.zeros(B, N, dtype=torch.bool, device=real.device)
        kept_slots.scatter_(1, top, True)
        kept_slots &= present
        keep = keep & kept_slots.gather(1, slot)
    if "tokens" in ranking:
        values = [layer.values for layer in _cross_layers(cache)]
        weights = _token_attention(queries, keys, values, real, H, cfg)  # (B, T)
        weights = weights.masked_fill(~keep, float("-inf"))
        counts = keep.sum(dim=1)  # (B,) candidates per question
        wanted = torch.ceil(counts.double() * cfg.keep_tokens / 100).long().clamp(min=1)
        order = weights.argsort(dim=1, descending=True, stable=True)  # (B, T)
        rank = torch.empty_like(order).scatter_(
            1, order, torch.arange(T, device=real.device).expand(B, T)
        )
        keep = keep & (rank < wanted[:, None])
    return keep


def _token_attention(queries, keys, values, real, H, cfg) -> torch.Tensor:
    """(B, T) float32 cross-attention probability of each encoder token at the ranking step,
    averaged over heads (and over layers unless one is chosen), optionally times ||v||."""
    chosen = range(len(keys)) if cfg.keep_tokens_layer is None else [cfg.keep_tokens_layer]
    B, T = real.shape
    per_layer = []
    for layer in chosen:
        q = queries[layer].float().view(B, 1, H, -1).transpose(1, 2)  # (B, H, 1, dk)
        k = keys[layer].float()  # (B, H, T, dk)
        logits = (q @ k.transpose(-1, -2)).squeeze(2)  # (B, H, T); T5: no 1/sqrt(dk)
        probs = logits.masked_fill(~real[:, None, :], float("-inf")).softmax(dim=-1)
        if cfg.keep_tokens_by_value_norm:
            probs = probs * values[layer].float().norm(dim=-1)  # (B, H, T)
        per_layer.append(probs.mean(dim=1))
    return torch.stack(per_layer).mean(dim=0)


def _keep_tokens(
    encoding: FusedEncoding, cache: EncoderDecoderCache, keep: torch.Tensor
) -> FusedEncoding:
    """The encoding and every layer's cross-attention keys/values cut down to the kept tokens,
    each question's in their original order, right-padded to the longest kept count T'."""
    T = keep.shape[1]
    order, mask = _kept_positions(keep)
    for layer in _cross_layers(cache):
        if layer.keys.shape[2] == T:  # not cut inside the step already
            _gather_layer(layer, order)  # (B, H, T', dk)
    hidden = encoding.hidden.gather(
        1, order[:, :, None].expand(-1, -1, encoding.hidden.shape[-1])
    )  # (B, T', D): not read again (the cache holds its keys and values), kept for the shapes
    token_passage = encoding.token_passage.gather(1, order).masked_fill(~mask, -1)
    return FusedEncoding(hidden=hidden, mask=mask.long(), token_passage=token_passage)


def _kept_positions(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For a (B, T) keep mask: (B, T') positions of each question's kept tokens, in order, then
    padding (T' = the most kept by a question), and the (B, T') mask of the real ones."""
    counts = keep.sum(dim=1)  # (B,)
    width = max(int(counts.max()), 1)
    # Kept positions first, in order (a stable sort of "not kept"), then the dropped ones.
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :width]
    return order, torch.arange(width, device=keep.device)[None, :] < counts[:, None]


def _cross_layers(cache: EncoderDecoderCache) -> list:
    """The cross-attention cache layers that hold keys (a layer-sparse decoder has fewer)."""
    return [
        layer
        for layer in cache.cross_attention_cache.layers
        if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0
    ]


@contextlib.contextmanager
def _capture_queries(t5) -> Iterator[list[torch.Tensor | None]]:
    """Each decoder layer's cross-attention query at the step run inside: (B, 1, H*dk)."""
    blocks = _cross_attention_blocks(t5)
    queries: list[torch.Tensor | None] = [None] * len(blocks)
    handles = []
    for i, block in enumerate(blocks):

        def hook(module, inputs, output, i=i):
            queries[i] = output.detach()

        handles.append(block.layer[1].EncDecAttention.q.register_forward_hook(hook))
    try:
        yield queries
    finally:
        for handle in handles:
            handle.remove()


def _cross_attention_blocks(t5) -> list:
    """The decoder blocks that have cross-attention (a layer-sparse decoder skips some)."""
    return [block for block in t5.decoder.block if hasattr(block.layer[1], "EncDecAttention")]
