"""Reader variants that decode faster but must be fine-tuned: FiD-Light and FiDO's layer-sparse
cross-attention.

Both are settings of `FiDReader` (`light_tokens`, `cross_attention_every`). `fid train-reader`
fine-tunes an existing reader with them (ReaderTrainConfig), records them in the model folder
(`fid_reader.json`, fid.models.settings), and every command that loads the folder applies them
(fid.models.loading).

- FiD-Light (Hofstätter et al. 2022, "FiD-Light: Efficient and Effective Retrieval-Augmented
  Text Generation", https://arxiv.org/abs/2209.14290): the encoder still reads each passage
  whole, but the decoder gets only the first k vectors of each (`light_tokens` = k). T, the
  fused length that every decoder layer's cross-attention reads at every step, drops from the
  sum of the passage lengths to the sum of min(length, k). `FiDReader.encode` selects them.
- FiDO (de Jong et al. 2022, "FiDO: Fusion-in-Decoder optimized for stronger performance and
  faster inference", https://arxiv.org/abs/2212.08153): cross-attention in every K-th decoder
  layer only (`cross_attention_every` = K). The other layers' `T5LayerCrossAttention` sublayer
  is replaced by `NoCrossAttention`, which passes its input through: no copy of transformers'
  T5 code, T5Block and T5Stack run unchanged.

Layer 0 always keeps its cross-attention, for two reasons: T5Stack takes the cross-attention
position bias (1, H, q, T) that the first layer returns and hands it to every later layer, so it
must be computed there; and Hugging Face generate asks the cross-attention cache for its first
layer's length.

How a layer without cross-attention is recognised (by FiDReader.passage_scores, and by
fid.inference.accelerated_generation when it trims the cache): its `block.layer[1]` is a
`NoCrossAttention` (`has_cross_attention(block)`), which has no `EncDecAttention`; its entry of
`EncoderDecoderCache.cross_attention_cache.layers` is never filled (`keys` stays None).

The removed sublayers' weights (each one's q, k, v, o and layer norm) are dropped: they are not
parameters of the sparse model, so the optimizer holds no state for them and the saved
model.safetensors lacks them. Loading a folder that records cross_attention_every = K loads the
dense T5 (transformers initialises the missing sublayers, which `load_reader` checks are exactly
the removed ones) and removes the same sublayers again before any use.
"""

from __future__ import annotations

from torch import nn
from transformers import T5ForConditionalGeneration

from fid.errors import ConfigError


class NoCrossAttention(nn.Module):
    """Stands in for a decoder block's `T5LayerCrossAttention` (`block.layer[1]`) in a layer
    that does not read the encoder (FiDO). It has no parameters and no `EncDecAttention`.

    T5Block calls it as it calls the real sublayer and expects (hidden_states, cross-attention
    position bias, attention weights): the hidden states (B, q, D) and the position bias pass
    through unchanged (T5Stack shares the first layer's bias with every later layer).
    """

    def forward(
        self,
        hidden_states,
        key_value_states=None,
        attention_mask=None,
        position_bias=None,
        cache=None,
        **kwargs,
    ):
        return hidden_states, position_bias, None


def has_cross_attention(block: nn.Module) -> bool:
    """Whether a T5 decoder block reads the encoder (False: its sublayer is NoCrossAttention)."""
    return not isinstance(block.layer[1], NoCrossAttention)


def cross_attention_layers(t5: T5ForConditionalGeneration) -> list[int]:
    """Indices of the decoder layers that keep their cross-attention."""
    return [i for i, block in enumerate(t5.decoder.block) if has_cross_attention(block)]


def cross_attention_period(t5: T5ForConditionalGeneration) -> int:
    """The K of a decoder with cross-attention in every K-th layer (1: every layer)."""
    layers = cross_attention_layers(t5)
    n = len(t5.decoder.block)
    period = layers[1] if len(layers) > 1 else n
    if layers != list(range(0, n, period)):
        raise ValueError(f"decoder layers {layers} of {n} keep cross-attention: not every K-th")
    return period


def check_variant(
    light_tokens: int | None,
    cross_attention_every: int | None,
    decoder_layers: int,
    cross_attention_bias: bool,
) -> None:
    """Refuses variant settings that no reader of this shape can take.

    Raises:
        ConfigError: naming the key: light_tokens < 1; cross_attention_every outside
            [1, decoder_layers]; either set on a model that keeps a released FiD checkpoint's
            cross-attention position bias.
    """
    # (fid.config's check_range, written out: models read no configs)
    if light_tokens is not None and not light_tokens >= 1:
        raise ConfigError(f"light_tokens = {light_tokens!r} is out of range: expected >= 1")
    if cross_attention_every is not None and not 1 <= cross_attention_every <= decoder_layers:
        raise ConfigError(
            f"cross_attention_every = {cross_attention_every!r} is out of range: expected 1 to "
            f"{decoder_layers} (the reader's decoder has {decoder_layers} layers)"
        )
    if cross_attention_bias:
        for name, value, plain in (
            ("light_tokens", light_tokens, None),
            ("cross_attention_every", cross_attention_every, 1),
        ):
            if value not in (None, plain):
                raise ConfigError(
                    f"{name} = {value!r} needs a reader without a cross-attention position bias, "
                    "but this one keeps a released FiD checkpoint's (converted with "
                    "--keep-cross-attention-bias, to reproduce the original's numbers), which "
                    "depends on each token's position in the original's (N x L) layout. Hint: "
                    "fine-tune a checkpoint converted without --keep-cross-attention-bias"
                )


def remove_cross_attention(t5: T5ForConditionalGeneration, every: int) -> None:
    """Keeps cross-attention in decoder layers 0, K, 2K, ... only (K = `every`); the others'
    sublayers (and their weights) are replaced by NoCrossAttention, in place.

    A layer removed before cannot come back (its weights are gone): K must keep a subset of
    the layers that still have cross-attention.

    Raises:
        ConfigError: K out of range, or asking for a layer that was removed before.
    """
    blocks = t5.decoder.block
    check_variant(None, every, len(blocks), cross_attention_bias=False)
    missing = [i for i in range(0, len(blocks), every) if not has_cross_attention(blocks[i])]
    if missing:
        current = cross_attention_period(t5)
        raise ConfigError(
            f"cross_attention_every = {every} needs cross-attention in decoder layers "
            f"{missing}, which this reader no longer has (it was fine-tuned with "
            f"cross_attention_every = {current}): removed layers cannot be restored. Expected "
            f"a multiple of {current}"
        )
    for i, block in enumerate(blocks):
        if i % every and has_cross_attention(block):
            block.layer[1] = NoCrossAttention()


def removed_weight_prefixes(every: int, decoder_layers: int) -> list[str]:
    """State-dict key prefixes of the cross-attention sublayers that `every` removes."""
    return [f"decoder.block.{i}.layer.1." for i in range(decoder_layers) if i % every]
