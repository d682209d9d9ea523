"""train_retriever(): distil the reader's passage scores into a DualEncoder.

Loss (Izacard & Grave 2021, https://arxiv.org/abs/2012.04584): for each question,
KL(softmax(reader scores / T_r) || softmax(retriever scores / T_q)) over its scored passages,
optionally with the batch's other passages as extra negatives (teacher probability 0); or, with
`objective: emdr2`, EMDR2's -log sum_k p_retriever(k | q) p_reader(answer | q, k)
(fid.training.retriever_losses), over each question's scored passages
(fid.training.retriever_examples). Dev metrics run over the WHOLE dev set and re-rank each dev
question's candidate list (the passages the reader scored, not the corpus), in percent: whether
the reader's top passage is in the retriever's top k of them (candidate_agreement@k) and
whether that top k holds an answer (candidate_answer_recall@k). Full-corpus top-k accuracy is
`fid eval-retrieval`'s, after indexing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from fid.config import ConfigError, RetrieverTrainConfig
from fid.data.examples import load_examples, without_passages
from fid.data.reader_batches import epoch_batches
from fid.errors import DataError
from fid.models.folder_checks import check_retriever
from fid.models.retriever import DualEncoder, DualEncoderSpec, RetrieverTokenizer
from fid.runtime import distributed
from fid.runtime.precision import resolve_precision
from fid.training.retriever_examples import (
    DistillationExample,
    LazyDistillation,
    distillation_examples,
)
from fid.training.retriever_losses import distillation_loss, emdr2_loss
from fid.training.runs import train_and_export
from fid.training.step_oom_recovery import halve

logger = logging.getLogger(__name__)


class RetrieverTask:
    """The retriever as a `TrainTask`."""

    def __init__(
        self,
        model: DualEncoder,
        tokenizer,
        cfg: RetrieverTrainConfig,
        train: Sequence[DistillationExample],
        dev: Sequence[DistillationExample],
        device: torch.device,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.encode = RetrieverTokenizer.for_spec(
            tokenizer, model.spec, cfg.question_max_tokens, cfg.passage_max_tokens
        )
        self.cfg = cfg
        self.train = train
        self.dev = dev
        self.device = device
        self.dev_metric = cfg.select_on
        # question index -> its question and passage tokens, counted when first needed
        self._counted: dict[int, int] = {}

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        return epoch_batches(
            len(self.train), self.cfg.batch_size_per_device, seed=self.cfg.seed, epoch=epoch
        )

    def _embed(self, model: torch.nn.Module, examples: Sequence[DistillationExample]):
        questions = self.encode.questions([e.question for e in examples]).to(self.device)
        passages = self.encode.passages(
            [t for e in examples for t in e.titles], [t for e in examples for t in e.texts]
        ).to(self.device)
        return model(
            questions["input_ids"],
            questions["attention_mask"],
            passages["input_ids"],
            passages["attention_mask"],
        )

    def loss(self, model: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        examples = [self.train[i] for i in indices]
        q, p = self._embed(model, examples)
        owner = torch.cat(
            [torch.full((len(e.texts),), b, dtype=torch.long) for b, e in enumerate(examples)]
        ).to(self.device)
        teacher = torch.cat([e.teacher for e in examples]).to(self.device)
        if self.cfg.objective == "emdr2":
            return emdr2_loss(
                q, p, owner, teacher, self.cfg.retriever_temperature, self.cfg.in_batch_negatives
            )
        return distillation_loss(
            q,
            p,
            owner,
            teacher,
            self.cfg.reader_temperature,
            self.cfg.retriever_temperature,
            self.cfg.in_batch_negatives,
            self.cfg.kl_reduction,
        )

    def loss_items(self, indices: list[int]) -> int:
        """What `loss(indices)` averages over: its questions ("batchmean"), or its (question,
        own passage) pairs (the original's "mean")."""
        if self.cfg.kl_reduction == "mean":
            return sum(len(self.train[i].texts) for i in indices)
        return len(indices)

    def item_tokens(self, indices: list[int]) -> int:
        """The question and passage tokens of a micro-batch (padding aside)."""
        return sum(self._question_tokens(indices))

    def split(self, indices: list[int]) -> list[list[int]]:
        """Two micro-batches of about equal tokens; one question stays whole, and so does a
        micro-batch whose questions are each other's in-batch negatives (part of the loss)."""
        if len(indices) < 2 or self.cfg.in_batch_negatives:
            return [indices]
        cut = halve(self._question_tokens(indices))
        return [indices[:cut], indices[cut:]]

    def question_ids(self, indices: list[int]) -> list[str]:
        return [self.train[i].id for i in indices]

    def _question_tokens(self, indices: list[int]) -> list[int]:
        for i in indices:
            if i not in self._counted:
                example = self.train[i]
                question = self.encode.questions([example.question])["attention_mask"]
                passages = self.encode.passage_lengths(example.titles, example.texts)
                self._counted[i] = int(question.sum()) + sum(passages)
        return [self._counted[i] for i in indices]

    def rankings(self, examples: Sequence[DistillationExample]) -> list[list[int]]:
        """The retriever's order of each question's candidate passages (best first)."""
        orders = []
        for start in range(0, len(examples), self.cfg.eval_batch_size):
            batch = examples[start : start + self.cfg.eval_batch_size]
            q, p = self._embed(self.model, batch)
            offset = 0
            for b, example in enumerate(batch):
                n = len(example.texts)
                scores = (p[offset : offset + n].float() @ q[b].float()).cpu()
                orders.append(torch.argsort(scores, descending=True, stable=True).tolist())
                offset += n
        return orders

    def evaluate(self) -> dict[str, float]:
        # Each rank ranks its share of the dev set; the metrics cover all of it.
        indices = distributed.shard_indices(len(self.dev))
        if isinstance(self.dev, LazyDistillation):
            mine = self.dev.subset(indices)
        else:
            mine = [self.dev[i] for i in indices]
        orders = distributed.gather_in_order(len(self.dev), self.rankings(mine))
        return ranking_metrics(self.dev, orders, self.cfg.eval_k)

    def save_model(self, path: Path) -> None:
        self.model.save_pretrained(path, tokenizer=self.tokenizer)


def ranking_metrics(
    examples: Sequence[DistillationExample], orders: Sequence[list[int]], ks: Sequence[int]
) -> dict[str, float]:
    """candidate_agreement@k and candidate_answer_recall@k (percent) of rankings of each
    question's candidate passages (the ones the reader scored)."""
    metrics: dict[str, float] = {}
    labeled = [(e, o) for e, o in zip(examples, orders, strict=True) if e.has_answer is not None]
    for k in ks:
        agree = [
            int(torch.argmax(e.teacher)) in o[:k] for e, o in zip(examples, orders, strict=True)
        ]
        metrics[f"candidate_agreement@{k}"] = 100 * sum(agree) / len(agree)
        if labeled:
            recall = [any(e.has_answer[i] for i in o[:k]) for e, o in labeled]
            metrics[f"candidate_answer_recall@{k}"] = 100 * sum(recall) / len(recall)
    metrics["n"] = len(examples)
    return metrics


def trained_spec(cfg: RetrieverTrainConfig) -> DualEncoderSpec:
    """The DualEncoderSpec a training config describes (its model folder records it)."""
    return DualEncoderSpec(
        pooling=cfg.pooling,
        projection_dim=cfg.projection_dim,
        shared=cfg.shared_encoder,
        input_format=cfg.input_format,
        query_prefix=cfg.query_prefix,
        passage_prefix=cfg.passage_prefix,
        question_max_tokens=cfg.question_max_tokens,
        passage_max_tokens=cfg.passage_max_tokens,
        normalize=cfg.normalize,
        # only a projection can come before or after pooling
        project_tokens=cfg.project_tokens and cfg.projection_dim is not None,
    )


# DualEncoderSpec fields -> the config keys they come from (the spec's lengths follow training).
_STRUCTURE = {
    "pooling": "pooling", "projection_dim": "projection_dim", "shared": "shared_encoder",
    "input_format": "input_format", "query_prefix": "query_prefix",
    "passage_prefix": "passage_prefix", "normalize": "normalize",
    "project_tokens": "project_tokens",
}  # fmt: skip


def continued_spec(
    spec: DualEncoderSpec, cfg: RetrieverTrainConfig, init_model: str | Path
) -> DualEncoderSpec:
    """The spec of a retriever trained from `init_model` (whose spec is `spec`) under `cfg`.

    Raises:
        ConfigError: `init_model` is a saved retriever built or fed otherwise than `cfg` says
            (training it under other inputs would mix two models).
    """
    wanted = trained_spec(cfg)
    changed = [
        f"{key} = {getattr(wanted, field)!r} (the model's: {getattr(spec, field)!r})"
        for field, key in _STRUCTURE.items()
        if getattr(spec, field) != getattr(wanted, field)
    ]
    if changed:
        raise ConfigError(
            f"{init_model} is a retriever built or fed otherwise than the config says: "
            f"{'; '.join(changed)}. Hint: set these as the model has them, or start from a "
            "plain encoder"
        )
    return dataclasses.replace(
        spec, question_max_tokens=cfg.question_max_tokens, passage_max_tokens=cfg.passage_max_tokens
    )


def train_retriever(
    cfg: RetrieverTrainConfig,
    train_path: Path,
    dev_path: Path,
    init_model: str,
    output_dir: Path,
    state_dir: Path,
    device: torch.device,
    passages_path: Path | None = None,
) -> dict:
    """Distils a retriever and writes its best dev model to `output_dir`.

    `passages_path`: the passage store (or TSV) of compact lists; their text is read as
    batches are built.

    Returns:
        The exported model's best step and dev metric.
    """
    check_retriever(init_model)
    # "auto" becomes what it means on this device, in the run's record too
    cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device))
    train_examples = load_examples(train_path, passages=passages_path)
    dev_examples = load_examples(dev_path, passages=passages_path)
    # training questions keep their first train_n_passages (the in-batch control's one
    # positive); dev questions rank all n_passages candidates
    train = distillation_examples(
        train_examples, cfg.train_n_passages or cfg.n_passages, cfg.score_key, str(train_path)
    )
    dev = distillation_examples(dev_examples, cfg.n_passages, cfg.score_key, str(dev_path))
    if cfg.select_on.startswith("candidate_answer_recall") and not any(
        e.answers for e in without_passages(dev_examples)
    ):
        raise DataError(f"{dev_path}: select_on {cfg.select_on} needs dev questions with answers")
    logger.info("%d training and %d dev questions", len(train), len(dev))
    # A projection head new to this model is initialised from torch's global generator: seeded
    # first, so that the same seed starts from the same weights (a run stopped before its
    # first checkpoint restarts from them: bitwise resume); the loop seeds again for dropout.
    torch.manual_seed(cfg.seed)
    model, tokenizer = DualEncoder.from_pretrained(init_model, trained_spec(cfg))
    # What the exported folder records: the structure (checked when continuing a saved
    # retriever) and the lengths it is trained with now.
    model.spec = continued_spec(model.spec, cfg, init_model)
    model.to(device)
    task = RetrieverTask(model, tokenizer, cfg, train, dev, device)
    inputs = {"train": train_path, "dev": dev_path}
    return train_and_export(task, cfg, state_dir, output_dir, device, cfg.precision, inputs)
