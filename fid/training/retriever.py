"""train_retriever(): distil the reader's passage scores into a DualEncoder.

Loss (Izacard & Grave 2021, https://arxiv.org/abs/2012.04584): for each question,
KL(softmax(reader scores / T_r) || softmax(retriever scores / T_q)) over its scored passages,
optionally with the batch's other passages as extra negatives (teacher probability 0); or, with
`objective: emdr2`, EMDR2's -log sum_k p_retriever(k | q) p_reader(answer | q, k). Dev metrics
run over the WHOLE dev set and re-rank each dev question's candidate list (the passages the
reader scored, not the corpus), in percent: whether the reader's top passage is in the
retriever's top k of them (candidate_agreement@k) and whether that top k holds an answer
(candidate_answer_recall@k). Full-corpus top-k accuracy is `fid eval-retrieval`'s, after
indexing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fid.config import ConfigError, RetrieverTrainConfig
from fid.data.examples import Example, ListExamples, load_examples, without_passages
from fid.data.reader_batches import epoch_batches
from fid.errors import DataError
from fid.metrics.has_answer import AnswerMatcher
from fid.models.folder_checks import check_retriever
from fid.models.retriever import DualEncoder, DualEncoderSpec, RetrieverTokenizer
from fid.runtime import distributed
from fid.runtime.precision import resolve_precision
from fid.training.runs import train_and_export
from fid.training.step_oom_recovery import halve

logger = logging.getLogger(__name__)


@dataclass
class DistillationExample:
    """A question with the passages the reader scored.

    Attributes:
        question: the question text.
        titles, texts: the N scored passages.
        teacher: (N,) reader scores.
        has_answer: N flags (None when the question has no answers).
        id: the question's id in its file (for messages).
    """

    question: str
    titles: list[str]
    texts: list[str]
    teacher: torch.Tensor
    has_answer: list[bool] | None
    id: str = ""


def distillation_example(
    example: Example, n_passages: int, score_key: str, source: str
) -> DistillationExample:
    """The scored passages of a question: the `n_passages` with the highest `score_key` (ties
    in file order), as the original's Dataset sorts by the reader's score and keeps the top
    n_context."""
    scored = [c for c in example.ctxs if c.get(score_key) is not None]
    ctxs = sorted(scored, key=lambda c: -float(c[score_key]))[:n_passages]
    if not ctxs:
        raise DataError(
            f"{source}: question {example.id!r} has no ctx with a '{score_key}' value. "
            "Hint: run `fid score-passages` on this file first."
        )
    flags = None
    if example.answers:
        matcher = AnswerMatcher(example.answers)
        flags = [
            c["has_answer"] if c.get("has_answer") is not None else matcher.matches(c["text"])
            for c in ctxs
        ]
    return DistillationExample(
        question=example.question,
        titles=[c["title"] for c in ctxs],
        texts=[c["text"] for c in ctxs],
        teacher=torch.tensor([float(c[score_key]) for c in ctxs]),
        has_answer=flags,
        id=example.id,
    )


class LazyDistillation(Sequence[DistillationExample]):
    """The distillation examples of compact lists, each built (its passages read) when indexed,
    so a process holds the text of one batch, not of the split."""

    def __init__(self, examples: ListExamples, n_passages: int, score_key: str, source: str):
        self.examples = examples
        self.args = (n_passages, score_key, source)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return LazyDistillation(self.examples[key], *self.args)
        return distillation_example(self.examples[key], *self.args)

    def subset(self, indices: Sequence[int]) -> LazyDistillation:
        """A view of the examples at these indices."""
        return LazyDistillation(self.examples.subset(indices), *self.args)


def distillation_examples(
    examples: Sequence[Example], n_passages: int, score_key: str, source: str
) -> Sequence[DistillationExample]:
    """Every question's `distillation_example`: a list for FiD records, a lazy sequence for
    compact lists (checked now, from the score column alone).

    Raises:
        DataError: a question without a `score_key` value (naming it and the file).
    """
    if not isinstance(examples, ListExamples):
        return [distillation_example(e, n_passages, score_key, source) for e in examples]
    lists = examples.lists
    column = lists.columns.get(score_key)
    for q in examples.positions:
        start, end = lists.offsets[q], lists.offsets[q + 1]
        if column is None or all(column.get(p) is None for p in range(start, end)):
            raise DataError(
                f"{source}: question {lists.fields[q]['id']!r} has no passage with a "
                f"'{score_key}' value. Hint: run `fid score-passages` on this file first."
            )
    return LazyDistillation(examples, n_passages, score_key, source)


def distillation_loss(
    question_embeddings: torch.Tensor,
    passage_embeddings: torch.Tensor,
    owner: torch.Tensor,
    teacher: torch.Tensor,
    reader_temperature: float,
    retriever_temperature: float,
    in_batch_negatives: bool,
    reduction: str = "batchmean",
) -> torch.Tensor:
    """KL(teacher || student) of each question's passage distribution.

    Args:
        question_embeddings: (B, D).
        passage_embeddings: (P, D), the batch's passages, question by question.
        owner: (P,) the question index of each passage.
        teacher: (P,) reader scores.
        reduction: "batchmean" sums each question's KL over its passages and averages over
            the questions; "mean" divides that sum by the number of (question, own passage)
            pairs instead, as `torch.nn.KLDivLoss()` (reduction 'mean', ÷ B·N) does in the
            original: N times smaller for N passages per question.

    Returns:
        A scalar loss.
    """
    B = question_embeddings.shape[0]
    log_student, own = _student_log_probs(
        question_embeddings, passage_embeddings, owner, retriever_temperature, in_batch_negatives
    )
    teacher_logits = (teacher / reader_temperature).float()[None, :].expand(B, -1)
    target = teacher_logits.masked_fill(~own, float("-inf")).softmax(dim=-1)  # 0 off own
    # xlogy: 0 * log 0 = 0 where the teacher gives no mass.
    kl = torch.xlogy(target, target) - target * log_student.masked_fill(~own, 0.0)
    if reduction == "mean":
        return kl.sum() / own.sum()
    return kl.sum(dim=-1).mean()


def _student_log_probs(
    question_embeddings: torch.Tensor,
    passage_embeddings: torch.Tensor,
    owner: torch.Tensor,
    retriever_temperature: float,
    in_batch_negatives: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) log-softmax of the retriever's scores over each question's passages (or the
    whole batch's, with in-batch negatives), and the (B, P) mask of each question's own."""
    B, D = question_embeddings.shape
    # (B, P) student logits in fp32 even under autocast (bf16 rounds |logit| 8-16 to steps of
    # 0.0625), scaled as in the original: q . p / sqrt(D).
    with torch.autocast(question_embeddings.device.type, enabled=False):
        logits = question_embeddings.float() @ passage_embeddings.float().T
    logits = logits / D**0.5 / retriever_temperature
    own = owner[None, :] == torch.arange(B, device=owner.device)[:, None]  # (B, P)
    if not in_batch_negatives:
        logits = logits.masked_fill(~own, float("-inf"))
    return logits.float().log_softmax(dim=-1), own


def emdr2_loss(
    question_embeddings: torch.Tensor,
    passage_embeddings: torch.Tensor,
    owner: torch.Tensor,
    answer_log_likelihoods: torch.Tensor,
    retriever_temperature: float,
    in_batch_negatives: bool,
) -> torch.Tensor:
    """EMDR2 (Sachan et al. 2021; Atlas's formulation): the retrieved passage as a latent
    variable, -log sum_k p_retriever(k | q) p_reader(a | q, k), averaged over the questions.

    Args:
        answer_log_likelihoods: (P,) log p(answer | question, passage) of each passage for its
            own question (PDist's scores); data, so no gradient reaches the reader. With
            in-batch negatives, other questions' passages take retriever probability mass but
            add no likelihood.

    Returns:
        A scalar loss.
    """
    log_student, own = _student_log_probs(
        question_embeddings, passage_embeddings, owner, retriever_temperature, in_batch_negatives
    )
    # (B, P) log p_retriever(k | q) + log p_reader(a | q, k), on the question's own passages
    joint = (log_student + answer_log_likelihoods.float()[None, :]).masked_fill(~own, float("-inf"))
    return -torch.logsumexp(joint, dim=-1).mean()


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
