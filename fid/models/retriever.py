"""DualEncoder: a bi-encoder retriever over any Hugging Face encoder (BERT, MiniLM, ...).

Izacard & Grave 2021, "Distilling Knowledge from Reader to Retriever for Question Answering"
(https://arxiv.org/abs/2012.04584): one encoder shared by questions and passages (or two),
masked mean pooling (CLS optional), an optional linear projection + LayerNorm to the indexing
dimension (applied to every token before pooling, as the original's `embed_text` does, or to
the pooled vector), optional L2 normalisation (cosine), and score = q . p / sqrt(D).

Shapes: B questions, N passages per question, P passages in a flat batch, L tokens, D output
dimension.

Saved folder layout (`save_pretrained`):
    dual_encoder.json     the DualEncoderSpec: how the model is built (pooling, projection,
                          sharing, normalisation) and fed (input format, prefixes, lengths)
    question_encoder/     a plain Hugging Face model folder (+ tokenizer)
    passage_encoder/      only when the encoders are not shared
    head.safetensors      projection + LayerNorm weights, when projected
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_MAPPING

from fid.errors import InputError
from fid.models.folder_checks import ModelFolderError
from fid.models.pretrained import load_pretrained
from fid.models.retriever_spec import (  # noqa: F401 (the spec's names, also from here)
    CONFIG_FILE,
    HEAD_FILE,
    INPUT_FORMATS,
    DualEncoderSpec,
)
from fid.models.sentence_transformers import sentence_transformers_spec
from fid.models.settings import ModelSettingsError
from fid.text_files import read_text


class DualEncoder(nn.Module):
    """Question and passage encoders with pooling and an optional projection head.

    Args:
        question_encoder: a Hugging Face encoder (AutoModel).
        passage_encoder: a second encoder, or None to share the question encoder.
        spec: pooling, projection and provenance.
    """

    def __init__(
        self,
        question_encoder: nn.Module,
        passage_encoder: nn.Module | None,
        spec: DualEncoderSpec,
    ):
        super().__init__()
        for encoder in (question_encoder, passage_encoder):
            # BERT's pooler (a dense layer on [CLS]) is never used here; DDP fails on
            # parameters that get no gradient, so it is dropped.
            if getattr(encoder, "pooler", None) is not None:
                encoder.pooler = None
        self.question_encoder = question_encoder
        self.passage_encoder = passage_encoder
        self.spec = spec
        hidden = question_encoder.config.hidden_size
        self.proj = self.norm = None
        if spec.projection_dim is not None:
            self.proj = nn.Linear(hidden, spec.projection_dim)
            self.norm = nn.LayerNorm(spec.projection_dim)

    @property
    def dim(self) -> int:
        """Output (indexing) dimension D."""
        return self.spec.projection_dim or self.question_encoder.config.hidden_size

    def _embed(self, encoder: nn.Module, input_ids, attention_mask) -> torch.Tensor:
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        project_tokens = self.proj is not None and self.spec.project_tokens
        if project_tokens:
            hidden = self.norm(self.proj(hidden))  # (P, L, D): every token, then pool
        if self.spec.pooling == "cls":
            pooled = hidden[:, 0]  # (P, H or D)
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (P, L, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (P, H or D)
        if self.proj is not None and not project_tokens:
            pooled = self.norm(self.proj(pooled))  # (P, D)
        if self.spec.normalize:
            pooled = nn.functional.normalize(pooled, dim=-1)
        return pooled

    def encode_questions(self, input_ids, attention_mask) -> torch.Tensor:
        """(B, L) token ids -> (B, D) embeddings."""
        return self._embed(self.question_encoder, input_ids, attention_mask)

    def encode_passages(self, input_ids, attention_mask) -> torch.Tensor:
        """(P, L) token ids -> (P, D) embeddings."""
        encoder = self.passage_encoder or self.question_encoder
        return self._embed(encoder, input_ids, attention_mask)

    def forward(
        self, question_ids, question_mask, passage_ids, passage_mask
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both sides at once (what DDP wraps): (B, D) questions and (P, D) passages."""
        return (
            self.encode_questions(question_ids, question_mask),
            self.encode_passages(passage_ids, passage_mask),
        )

    def scores(self, questions: torch.Tensor, passages: torch.Tensor) -> torch.Tensor:
        """Scaled dot products: questions (B, D) x passages (B, N, D) -> (B, N).

        The 1/sqrt(D) scale (as in the original) only matters for the training loss; ranking
        by raw dot product (the index) gives the same order.
        """
        return torch.einsum("bd,bnd->bn", questions, passages) / math.sqrt(questions.shape[-1])

    def save_pretrained(self, folder: str | Path, tokenizer=None) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_FILE).write_text(json.dumps(asdict(self.spec), indent=2) + "\n")
        self.question_encoder.save_pretrained(folder / "question_encoder")
        if tokenizer is not None:
            tokenizer.save_pretrained(folder / "question_encoder")
        if self.passage_encoder is not None:
            self.passage_encoder.save_pretrained(folder / "passage_encoder")
        if self.proj is not None:
            head = {f"proj.{k}": v for k, v in self.proj.state_dict().items()}
            head.update({f"norm.{k}": v for k, v in self.norm.state_dict().items()})
            save_file({k: v.contiguous() for k, v in head.items()}, str(folder / HEAD_FILE))

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path, spec: DualEncoderSpec | None = None
    ) -> tuple[DualEncoder, object]:
        """Loads a saved DualEncoder folder, or starts one from a plain HF encoder.

        Args:
            name_or_path: a folder written by `save_pretrained`, or a plain encoder (hub name
                or folder).
            spec: how to build a dual encoder around a plain encoder (default: the defaults;
                `base_model` is filled in). Ignored for a saved DualEncoder, whose own spec is
                used (`model.spec`: the caller compares it with what it expects). A
                sentence-transformers folder prescribes its pooling, normalisation, format and
                prompts (fid.models.sentence_transformers): without `spec` they are used; a
                `spec` that pools or normalises otherwise is an error.

        Returns:
            The model and its tokenizer.
        """
        path = Path(name_or_path)
        explicit = spec is not None
        if (path / CONFIG_FILE).is_file():
            # (checked by fid.models.folder_checks.check_retriever when fid loads a folder)
            text = read_text(path / CONFIG_FILE, "the dual encoder's spec", ModelFolderError)
            spec = DualEncoderSpec(**json.loads(text))
            question = _load_encoder(path / "question_encoder")
            passage = None
            if not spec.shared:
                passage = _load_encoder(path / "passage_encoder")
            model = cls(question, passage, spec)
            if spec.projection_dim is not None:
                head = load_file(str(path / HEAD_FILE))
                model.proj.load_state_dict(
                    {k[5:]: v for k, v in head.items() if k.startswith("proj.")}
                )
                model.norm.load_state_dict(
                    {k[5:]: v for k, v in head.items() if k.startswith("norm.")}
                )
            tokenizer = AutoTokenizer.from_pretrained(path / "question_encoder")
            return model, tokenizer
        spec = replace(spec or DualEncoderSpec(), base_model=str(name_or_path))
        prescribed = sentence_transformers_spec(path) if path.is_dir() else None
        if prescribed is not None:
            spec = _as_prescribed(spec, prescribed, path, explicit)
        question = _load_encoder(name_or_path)
        passage = None if spec.shared else _load_encoder(name_or_path)
        return cls(question, passage, spec), AutoTokenizer.from_pretrained(name_or_path)


def _load_encoder(name_or_path: str | Path) -> nn.Module:
    """A Hugging Face encoder, without BERT's pooler when its weights have none.

    The pooler (a dense layer on [CLS]) is never used here and `DualEncoder` drops it, so the
    folders this project writes (`save_pretrained`, `fid init-retriever`) hold no pooler
    weights; built with one, transformers would report them missing at every load. A local
    folder whose safetensors hold no `pooler.` weight is therefore loaded without it, where
    the architecture has that switch (BERT and its kin); anything else loads as it is.
    """
    folder = Path(name_or_path)
    weights = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    names = []
    for file in weights:
        with safe_open(file, "pt") as handle:  # the header only
            names += handle.keys()
    if weights and not any(name.startswith("pooler.") for name in names):
        model_class = MODEL_MAPPING.get(type(AutoConfig.from_pretrained(folder)), None)
        init = inspect.signature(model_class.__init__).parameters if model_class else {}
        if "add_pooling_layer" in init:
            return load_pretrained(AutoModel, str(folder), add_pooling_layer=False)
    return load_pretrained(AutoModel, name_or_path)


def _as_prescribed(
    spec: DualEncoderSpec, prescribed: dict, folder: Path, explicit: bool
) -> DualEncoderSpec:
    """`spec` for a sentence-transformers folder: its pooling and normalisation are the model's
    own (a different one is refused); without an explicit spec, its format and prompts too."""
    if not explicit:
        return replace(spec, **prescribed)
    clash = [
        f"{key} = {getattr(spec, key)!r} (the model's: {prescribed[key]!r})"
        for key in ("pooling", "normalize")
        if getattr(spec, key) != prescribed[key]
    ]
    if clash:
        raise ModelSettingsError(
            f"{folder} is a sentence-transformers model, trained to be pooled and normalised "
            f"as its modules.json says; the config has {'; '.join(clash)}. Hint: set them as "
            "the model has them"
        )
    return spec


class RetrieverTokenizer:
    """Questions and passages to (P, L) id tensors, in the input format of the model's spec.

    Args:
        tokenizer: the encoder's Hugging Face tokenizer.
        question_max_tokens, passage_max_tokens: truncation of each side.
        input_format, query_prefix, passage_prefix: as in DualEncoderSpec.
    """

    def __init__(
        self,
        tokenizer,
        question_max_tokens: int,
        passage_max_tokens: int,
        input_format: str = "pair",
        query_prefix: str = "",
        passage_prefix: str = "",
    ):
        if input_format not in INPUT_FORMATS:
            raise ValueError(f"input_format {input_format!r}: expected one of {INPUT_FORMATS}")
        self.tokenizer = tokenizer
        self.question_max_tokens = question_max_tokens
        self.passage_max_tokens = passage_max_tokens
        self.input_format = input_format
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix

    @classmethod
    def for_spec(
        cls, tokenizer, spec: DualEncoderSpec, question_max_tokens: int, passage_max_tokens: int
    ) -> RetrieverTokenizer:
        """The input encoder of a model with this spec, at the given lengths."""
        return cls(
            tokenizer,
            question_max_tokens,
            passage_max_tokens,
            spec.input_format,
            spec.query_prefix,
            spec.passage_prefix,
        )

    def question_texts(self, texts: list[str]) -> list[str]:
        if self.input_format == "fid":
            return [f"{self.query_prefix}question: {text}" for text in texts]
        return [self.query_prefix + text for text in texts]

    def _passage_inputs(self, titles: list[str], texts: list[str]) -> tuple[list, dict]:
        """(positional inputs, truncation) of the tokenizer call for passages."""
        prefix = self.passage_prefix
        if self.input_format == "pair":
            return [[prefix + title for title in titles], texts], {"truncation": "only_second"}
        if self.input_format == "fid":
            joined = [
                f"{prefix}title: {t} context: {c}" for t, c in zip(titles, texts, strict=True)
            ]
        else:
            joined = [f"{prefix}{t} {c}" for t, c in zip(titles, texts, strict=True)]
        return [joined], {"truncation": True}

    def questions(self, texts: list[str]) -> dict[str, torch.Tensor]:
        return self.tokenizer(
            self.question_texts(texts),
            truncation=True,
            max_length=self.question_max_tokens,
            padding=True,
            return_tensors="pt",
        )

    def passages(
        self, titles: list[str], texts: list[str], pad_to_max_length: bool = False
    ) -> dict[str, torch.Tensor]:
        inputs, truncation = self._passage_inputs(titles, texts)
        return self.tokenizer(
            *inputs,
            **truncation,
            max_length=self.passage_max_tokens,
            padding="max_length" if pad_to_max_length else True,
            return_tensors="pt",
        )

    def passage_lengths(self, titles: list[str], texts: list[str]) -> list[int]:
        """Token counts of passages (for sorting by length before encoding).

        Tokenised 1,024 at a time: a tokenizer's output for one passage (ids, mask, type ids
        as Python lists, its Rust encoding) costs ~50 KB, so a whole sort chunk of 65,536
        passages at once held ~3.4 GB only to keep their lengths."""
        lengths: list[int] = []
        for start in range(0, len(texts), 1024):
            inputs, truncation = self._passage_inputs(
                titles[start : start + 1024], texts[start : start + 1024]
            )
            encoded = self.tokenizer(
                *inputs, **truncation, max_length=self.passage_max_tokens,
                return_attention_mask=False, return_token_type_ids=False,
            )  # fmt: skip
            lengths.extend(len(ids) for ids in encoded["input_ids"])
        return lengths


def load_released_retriever(state_dict: dict[str, torch.Tensor], model: DualEncoder) -> None:
    """Loads a released facebookresearch/FiD retriever state dict into a DualEncoder.

    Released keys are `model.<BertModel keys>` plus `proj.*`/`norm.*` when projected. BERT's
    pooler (`model.pooler.*`) is dropped: the original never uses it (it gets no gradient).
    """
    encoder_state = {
        k[len("model.") :]: v
        for k, v in state_dict.items()
        if k.startswith("model.") and not k.startswith("model.pooler.")
    }
    missing, unexpected = model.question_encoder.load_state_dict(encoder_state, strict=False)
    # Position ids are buffers that newer BERTs do not save.
    missing = [k for k in missing if not k.endswith("position_ids")]
    unexpected = [k for k in unexpected if not k.endswith("position_ids")]
    if missing or unexpected:
        raise InputError(
            f"released retriever keys do not fit the encoder: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    if model.proj is not None:
        model.proj.load_state_dict(
            {k[5:]: v for k, v in state_dict.items() if k.startswith("proj.")}
        )
        model.norm.load_state_dict(
            {k[5:]: v for k, v in state_dict.items() if k.startswith("norm.")}
        )
    elif any(k.startswith(("proj.", "norm.")) for k in state_dict):
        raise InputError("the released retriever has a projection head: set projection_dim")
