"""FiDReader: Fusion-in-Decoder on an unmodified Hugging Face T5ForConditionalGeneration.

Izacard & Grave 2021, "Leveraging Passage Retrieval with Generative Models for Open Domain
Question Answering" (https://arxiv.org/abs/2007.01282): each of a question's N passages is
encoded separately, and the decoder attends over the concatenation of all their token states.

Shapes: B questions, N passage slots, L tokens per slot, T fused encoder tokens per question,
D model width, H heads.

The encoder side (fid.models.fused_encoding) has two exact savings over the original, which
padded every passage to the maximum length:
- length buckets: the batch's real passages are sorted by length and encoded in groups, each
  padded only to its own longest passage;
- packing: the decoder gets only each question's real tokens, back to back (T = the sum of its
  passage lengths), because cross-attention has no position bias, so the order and spacing of
  encoder tokens do not change its result.

A model imported from a released FiD checkpoint with `--keep-cross-attention-bias` keeps the
position bias that transformers 3 gave the first decoder block's cross-attention
(fid.models.cross_attention_bias; fid/models/convert.py explains it): its encoder tokens then keep
the original's (B, N*L) positions (no packing), and it reproduces the original's logits.

Two variants that must be fine-tuned (fid.models.reader_variants): FiD-Light hands the decoder
only the first `light_tokens` vectors of each passage; FiDO's layer-sparse decoder keeps
cross-attention in every `cross_attention_every`-th layer only.

The reader's passage scores (the distillation teachers) read its cross-attention through
fid.models.cross_attention_scores (hooks on the q and k projections) and
fid.models.shared_cross_attention (one question's keys and values shared by its copies).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from transformers import T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

from fid.models.bucketed_encoder import attach_bucket_forward
from fid.models.cross_attention_bias import first_cross_attention, has_cross_attention_bias
from fid.models.cross_attention_scores import capture_cross_attention, scores_from_projections
from fid.models.fused_encoding import FusedEncoding, fuse_passages
from fid.models.reader_variants import check_variant, cross_attention_period, remove_cross_attention
from fid.models.shared_cross_attention import shared_cross_attention


class FiDReader(nn.Module):
    """A T5 encoder-decoder that reads N passages per question.

    Args:
        t5: the wrapped model (any T5-family checkpoint).
        encoder_buckets: groups of similar-length passages encoded together; 1 = one group.
        pack_passages: give the decoder only real tokens (B, T); False keeps the original's
            (B, N*L) layout with masked padding.
        light_tokens: FiD-Light: the decoder reads only the first this-many encoder vectors of
            each passage (None: all).
        cross_attention_every: FiDO: cross-attention in decoder layers 0, K, 2K, ... only;
            the others' are removed from `t5` (None: `t5` as it is).

    Raises:
        ConfigError: a variant setting out of range, or set on a model with a cross-attention
            position bias (fid.models.reader_variants.check_variant).
    """

    def __init__(
        self,
        t5: T5ForConditionalGeneration,
        encoder_buckets: int = 8,
        pack_passages: bool = True,
        light_tokens: int | None = None,
        cross_attention_every: int | None = None,
    ):
        super().__init__()
        bias = has_cross_attention_bias(t5)
        check_variant(light_tokens, cross_attention_every, len(t5.decoder.block), bias)
        if cross_attention_every is not None:
            remove_cross_attention(t5, cross_attention_every)
        self.t5 = t5
        attach_bucket_forward(t5.encoder)
        self.encoder_buckets = encoder_buckets
        # Positions matter to a cross-attention bias: keep the original's layout then.
        self.pack_passages = pack_passages and not bias
        self.light_tokens = light_tokens

    def save_pretrained(self, path) -> None:
        """Saves the wrapped T5 as a plain Hugging Face model (safetensors)."""
        self.t5.save_pretrained(path)

    def save_config(self, path) -> None:
        """The files of `save_pretrained` but the weights (which a sharded reader's ranks
        write together: fid.training.sharded_weights)."""
        self.t5.config.save_pretrained(path)
        if self.t5.generation_config is not None:
            self.t5.generation_config.save_pretrained(path)

    def fsdp_units(self) -> list[nn.Module]:
        """The transformer blocks: the units that FSDP shards."""
        return [*self.t5.encoder.block, *self.t5.decoder.block]

    @property
    def config(self):
        return self.t5.config

    @property
    def cross_attention_every(self) -> int:
        """FiDO's K: cross-attention in every K-th decoder layer (1: the plain reader)."""
        return cross_attention_period(self.t5)

    def set_attention(self, kind: str, device: torch.device) -> None:
        """T5's attention kernel; "auto": eager on CPU (faster there), sdpa on GPU.

        Passage scoring does not depend on it (it reads the q and k projections itself).
        """
        if kind == "auto":
            kind = "sdpa" if device.type == "cuda" else "eager"
        self.t5.set_attn_implementation(kind)

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Recompute block activations in backward; Hugging Face applies it only in training."""
        if enabled:
            self.t5.activation_checkpointing_enable({"use_reentrant": False})
        else:
            self.t5.activation_checkpointing_disable()

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> FusedEncoding:
        """Encodes every passage on its own and fuses each question's token states.

        Args:
            input_ids: (B, N, L) right-padded token ids.
            attention_mask: (B, N, L) 1 for real tokens.

        Returns:
            The fused encoding; T = longest question's token count when packing, else N*L.
            With light_tokens = k, each passage gives only its first min(length, k) tokens
            (and L becomes min(L, k) in the unpacked layout).
        """
        return fuse_passages(
            self.t5.encoder,
            input_ids,
            attention_mask,
            self.encoder_buckets,
            self.pack_passages,
            self.light_tokens,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
    ):
        """Teacher-forced decoding over the fused passages.

        Args:
            input_ids: (B, N, L) passage token ids.
            attention_mask: (B, N, L).
            labels: (B, A) target ids, -100 where padded; gives `loss`.
            decoder_input_ids: (B, A') when not derived from labels.

        Returns:
            transformers' Seq2SeqLMOutput (loss, logits (B, A, vocab)).
        """
        encoding = self.encode(input_ids, attention_mask)
        return self.t5(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoding.hidden),
            attention_mask=encoding.mask,
            labels=labels,
            decoder_input_ids=decoder_input_ids,
            use_cache=False,
        )

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        max_new_tokens: int,
        num_beams: int = 1,
    ) -> torch.Tensor:
        """Greedy or beam-search answers: (B, <= max_new_tokens + 1) ids starting with the
        decoder start token."""
        encoding = self.encode(input_ids, attention_mask)
        return self.t5.generate(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoding.hidden),
            attention_mask=encoding.mask,
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            do_sample=False,
        )

    @torch.no_grad()
    def answer_log_likelihoods(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        rows_per_pass: int = 64,
    ) -> torch.Tensor:
        """log p(answer | question, passage n alone) for every passage slot: the teacher of
        Atlas's perplexity distillation (PDist; Izacard et al. 2022, section 2.2), whose target
        is the softmax of these over the passages (with train-retriever's reader_temperature).

        The N passages of a question are read as N single-passage FiD inputs, batched: a FiD
        encoder encodes each passage independently, so row (b, n) is exactly the reader given
        passage n only. Rows are decoded `rows_per_pass` at a time (each holds (A, vocab)
        logits).

        Args:
            input_ids: (B, N, L).
            attention_mask: (B, N, L).
            labels: (B, A) answer ids, -100 where padded.

        Returns:
            (B, N) float32 summed answer-token log-probabilities; NaN for empty passage slots.
        """
        B, N, _ = input_ids.shape
        scores = torch.full((B, N), float("nan"), device=input_ids.device)
        question, slot = (attention_mask.sum(dim=-1) > 0).nonzero(as_tuple=True)  # (R,) each
        for start in range(0, len(question), rows_per_pass):
            q, n = question[start : start + rows_per_pass], slot[start : start + rows_per_pass]
            encoding = self.encode(
                input_ids[q, n].unsqueeze(1),  # (R, 1, L): one passage each
                attention_mask[q, n].unsqueeze(1),
            )
            scores[q, n] = self._answer_log_likelihood(encoding.hidden, encoding.mask, labels[q])
        return scores

    @torch.no_grad()
    def leave_one_out_log_likelihoods(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        rows_per_pass: int = 8,
    ) -> torch.Tensor:
        """How much log p(answer | question, all N passages) drops when passage n is left out:
        the teacher of Atlas's leave-one-out perplexity distillation (LOOP; Izacard et al. 2022,
        section 2.2: softmax over passages of -log p(answer | the others), the same
        distribution as the softmax of these drops).

        The passages are encoded once: in FiD each passage's encoder states do not depend on
        the others, so "passage n removed" is the fused encoding with passage n's tokens
        masked from the decoder's cross-attention. (With a kept cross-attention position bias
        the other passages keep their positions, where removing the passage from the input
        would shift the later ones.) Question by question, its copies (all passages, then each
        real passage masked) differ only in that mask: every decoder layer's cross-attention
        keys and values are projected once a question and shared by its copies, decoded
        `rows_per_pass` at a time (`_leave_one_out_question`).

        A question with one passage scores it 0.0, decoding nothing: left out, it leaves no
        passage, and a decoder that cross-attends to nothing has no defined likelihood (its
        all-masked attention fell on whatever padding the batch had, so the score changed with
        the batch size). 0 is the neutral score: the teacher over one passage,
        softmax(score / temperature), is 1 whatever it is, and EMDR2 reads none (it trains on
        pdist's scores).

        Args:
            input_ids: (B, N, L).
            attention_mask: (B, N, L).
            labels: (B, A) answer ids, -100 where padded.

        Returns:
            (B, N) float32 drops in summed answer log-probability; NaN for empty passage slots.
        """
        B, N, _ = input_ids.shape
        encoding = self.encode(input_ids, attention_mask)  # hidden (B, T, D), mask (B, T)
        scores = torch.full((B, N), float("nan"), device=input_ids.device)
        real = attention_mask.sum(dim=-1) > 0  # (B, N)
        for b in range(B):
            slots = real[b].nonzero().squeeze(1)  # (K,) the question's real passage slots
            if len(slots) == 1:
                scores[b, slots] = 0.0
            elif len(slots):
                likelihoods = self._leave_one_out_question(
                    encoding, b, slots, labels[b], rows_per_pass
                )  # (K + 1,): all passages, then each slot left out
                scores[b, slots] = likelihoods[0] - likelihoods[1:]
        return scores

    def _leave_one_out_question(
        self,
        encoding: FusedEncoding,
        b: int,
        slots: torch.Tensor,
        labels: torch.Tensor,
        rows_per_pass: int,
    ) -> torch.Tensor:
        """(K + 1,) summed log-probabilities of question b's answer `labels` (A,) given all its
        passages, then given all but each of `slots` (K,), in float32.

        The K + 1 copies read the same encoder states (T, D) under their own cross-attention
        masks: the states and the answer are expanded views, and each decoder layer's keys and
        values are projected once (fid.models.shared_cross_attention), not once a copy.
        """
        hidden = encoding.hidden[b : b + 1]  # (1, T, D)
        real = encoding.mask[b].bool()  # (T,)
        # Slot -1 tags padding, which the mask leaves out already: its copy reads everything.
        left_out = torch.cat([slots.new_full((1,), -1), slots])  # (K + 1,)
        parts = []
        with shared_cross_attention(self.t5, hidden):
            for dropped in left_out.split(rows_per_pass):
                R = len(dropped)
                kept = real & (encoding.token_passage[b] != dropped[:, None])  # (R, T)
                parts.append(
                    self._answer_log_likelihood(
                        hidden.expand(R, -1, -1),
                        kept.to(encoding.mask.dtype),
                        labels.expand(R, -1),
                    )
                )
        return torch.cat(parts)

    def _answer_log_likelihood(
        self, hidden: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """(R,) summed log-probabilities of `labels` (R, A) decoded from encoder states
        `hidden` (R, T, D) under cross-attention `mask` (R, T); in float32."""
        logits = self.t5(
            encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
            attention_mask=mask,
            decoder_input_ids=self.t5._shift_right(labels),
            use_cache=False,
        ).logits  # (R, A, vocab)
        with torch.autocast(hidden.device.type, enabled=False):
            log_probs = logits.float().log_softmax(dim=-1)
            token = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            return (token * (labels != -100)).sum(dim=-1)

    @torch.no_grad()
    def passage_scores(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mode: Literal["mean_logit", "attention_mass"] = "mean_logit",
    ) -> torch.Tensor:
        """Cross-attention relevance of each passage at the first decoding step.

        "mean_logit" (Izacard & Grave 2021, "Distilling Knowledge from Reader to Retriever for
        Question Answering", https://arxiv.org/abs/2012.04584): the pre-softmax cross-attention
        logits q.k (T5 has no 1/sqrt(d) scaling and no cross-attention position bias), averaged
        over layers, heads and the passage's real tokens. "attention_mass": the softmax
        probability that falls on the passage's tokens, averaged over layers and heads.
        "Layers" are those with cross-attention (all but in a FiDO reader); "tokens" those the
        decoder reads (the first light_tokens of each passage in a FiD-Light reader).

        Args:
            input_ids: (B, N, L).
            attention_mask: (B, N, L).

        Returns:
            (B, N) float32 scores; NaN for empty passage slots.
        """
        encoding = self.encode(input_ids, attention_mask)
        B, T = encoding.mask.shape
        N = input_ids.shape[1]
        start = torch.full(
            (B, 1), self.config.decoder_start_token_id, dtype=torch.long, device=input_ids.device
        )
        with capture_cross_attention(self.t5) as captured:
            self.t5.decoder(
                input_ids=start,
                encoder_hidden_states=encoding.hidden,
                encoder_attention_mask=encoding.mask,
                use_cache=False,
            )
        # The score arithmetic runs in float32 even under autocast: q.k sums over dk terms and
        # bf16 would round the per-token logits to ~3 significant digits.
        with torch.autocast(input_ids.device.type, enabled=False):
            scores = scores_from_projections(captured, encoding, N, self.config.num_heads, mode)
            if mode == "mean_logit" and has_cross_attention_bias(self.t5):
                # At the first step every key is in bucket 0: the bias adds its mean over heads
                # to every pre-softmax logit, as the original's scores hold it.
                scores = (
                    scores + first_cross_attention(self.t5).relative_attention_bias.weight[0].mean()
                )
        empty = attention_mask.sum(dim=-1) == 0  # (B, N)
        return scores.masked_fill(empty, float("nan"))
