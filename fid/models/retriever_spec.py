"""What a saved dual encoder is: its spec (how it is built and fed, `dual_encoder.json`) and the
names of its files. Below fid.models.retriever, so that the folder checks read a folder's spec
without importing the model (which imports them through the sentence-transformers reader).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

HEAD_FILE = "head.safetensors"
CONFIG_FILE = "dual_encoder.json"


INPUT_FORMATS = ("fid", "pair", "plain")


@dataclass(frozen=True)
class DualEncoderSpec:
    """How a DualEncoder is put together and fed (saved beside the weights, so that every
    command feeds the model as it was trained: fid.models.settings).

    Attributes:
        pooling: "mean" (masked mean of the token states) or "cls".
        projection_dim: a linear projection + LayerNorm to this size (None: the encoder's).
        shared: one encoder for questions and passages.
        base_model: the encoder it started from (provenance).
        input_format: "fid": single sequences `question: Q` and `title: T context: C`
            (facebookresearch/FiD's retriever); "pair": DPR-style `[CLS] Q [SEP]` and
            `[CLS] T [SEP] C [SEP]` sentence pairs; "plain": `Q` and `T C` as one sequence.
        query_prefix, passage_prefix: text put before every question / passage input (E5- and
            BGE-style encoders need e.g. "query: " and "passage: ").
        question_max_tokens, passage_max_tokens: the truncation it was trained with (None:
            not recorded).
        normalize: L2-normalise the embeddings (cosine similarity; sentence-transformers
            models with a Normalize module).
        project_tokens: apply the projection + LayerNorm to every token state and pool after
            (facebookresearch/FiD's order, measured 0.7 apart from pool-then-project on the
            golden fixtures); False projects the pooled vector (fid before 0.2; folders that
            do not record it).
    """

    pooling: Literal["mean", "cls"] = "mean"
    projection_dim: int | None = None
    shared: bool = True
    base_model: str = ""
    input_format: Literal["fid", "pair", "plain"] = "pair"
    query_prefix: str = ""
    passage_prefix: str = ""
    question_max_tokens: int | None = None
    passage_max_tokens: int | None = None
    normalize: bool = False
    project_tokens: bool = False

    def __post_init__(self):
        if self.input_format not in INPUT_FORMATS:
            raise ValueError(f"input_format {self.input_format!r}: expected one of {INPUT_FORMATS}")
