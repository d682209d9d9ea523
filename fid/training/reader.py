"""train_reader(): a FiD reader trained with the generic loop, evaluated by dev exact match."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from fid.config import ReaderTrainConfig
from fid.data.examples import Example, choose_target, load_examples, take, without_passages
from fid.data.reader_batches import ReaderCollator, epoch_batches
from fid.inference.generation import generate_answers
from fid.metrics.answers import answer_metrics
from fid.models.cross_attention_bias import has_cross_attention_bias
from fid.models.folder_checks import check_reader
from fid.models.loading import load_reader, reader_skeleton
from fid.models.reader import FiDReader
from fid.models.settings import ReaderSettings
from fid.runtime import distributed
from fid.runtime.precision import resolve_precision
from fid.training import sharding
from fid.training.runs import train_and_export
from fid.training.sharded_weights import export_weights_from_shards, load_weights_into_shards
from fid.training.step_oom_recovery import halve

logger = logging.getLogger(__name__)


class ReaderTask:
    """The reader as a `TrainTask`: teacher-forced loss, dev exact match, HF save format."""

    dev_metric = "exact_match"  # percent, as every dev metric (fid.metrics.answers)

    def __init__(
        self,
        reader: FiDReader,
        tokenizer,
        cfg: ReaderTrainConfig,
        train: Sequence[Example],
        dev: Sequence[Example],
        device: torch.device,
    ):
        self.model = reader
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.train = train
        self.dev = dev if cfg.eval_max_questions is None else dev[: cfg.eval_max_questions]
        self.device = device
        self.collator = ReaderCollator(
            tokenizer,
            n_passages=cfg.n_passages,
            passage_max_tokens=cfg.passage_max_tokens,
            target_max_tokens=cfg.target_max_tokens,
            pad_to_max_length=cfg.pad_to_max_length,
        )
        self.token_counts = None
        if cfg.max_tokens_per_batch is not None:
            self.token_counts = self.collator.question_token_counts(train)
        # question index -> passage tokens, counted when first needed (a step out of memory)
        self._counted: dict[int, int] = {}

    def epoch_batches(self, epoch: int) -> list[tuple[int, list[int]]]:
        batches = epoch_batches(
            len(self.train),
            self.cfg.batch_size_per_device,
            seed=self.cfg.seed,
            epoch=epoch,
            token_counts=self.token_counts,
            max_tokens=self.cfg.max_tokens_per_batch,
        )
        return [(epoch, indices) for indices in batches]

    def loss(self, model: torch.nn.Module, item: tuple[int, list[int]]) -> torch.Tensor:
        epoch, indices = item
        examples = [self.train[i] for i in indices]
        targets = [choose_target(example, self.cfg.seed, epoch) for example in examples]
        batch = self.collator(examples, targets).to(self.device)
        return model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss

    def loss_items(self, item: tuple[int, list[int]]) -> int:
        """The target tokens (EOS included) that `loss(item)` averages over."""
        epoch, indices = item
        targets = [choose_target(self.train[i], self.cfg.seed, epoch) for i in indices]
        return int((self.collator.encode_targets(targets) != -100).sum())

    def item_tokens(self, item: tuple[int, list[int]]) -> int:
        """The passage tokens of a micro-batch (what `max_tokens_per_batch` budgets)."""
        return sum(self._question_tokens(item[1]))

    def split(self, item: tuple[int, list[int]]) -> list[tuple[int, list[int]]]:
        """Two micro-batches of about equal passage tokens; one question stays whole."""
        epoch, indices = item
        if len(indices) < 2:
            return [item]
        cut = halve(self._question_tokens(indices))
        return [(epoch, indices[:cut]), (epoch, indices[cut:])]

    def question_ids(self, item: tuple[int, list[int]]) -> list[str]:
        return [self.train[i].id for i in item[1]]

    def _question_tokens(self, indices: list[int]) -> list[int]:
        if self.token_counts is not None:
            return [self.token_counts[i] for i in indices]
        new = [i for i in indices if i not in self._counted]
        if new:
            counts = self.collator.question_token_counts([self.train[i] for i in new])
            self._counted.update(zip(new, counts, strict=True))
        return [self._counted[i] for i in indices]

    def evaluate(self) -> dict[str, float]:
        # Each rank generates for its share of the dev set; all ranks get every prediction.
        mine = take(self.dev, distributed.shard_indices(len(self.dev)))
        # FSDP: the decoder stays gathered through the generation, not gathered at every token
        with sharding.kept_gathered(self.model.t5.decoder.block):
            local = generate_answers(
                self.model,
                self.tokenizer,
                self.collator,
                mine,
                self.cfg.eval_batch_size,
                self.cfg.max_new_tokens,
                self.cfg.num_beams,
                self.device,
            )
        predictions = distributed.gather_in_order(len(self.dev), local)
        metrics = answer_metrics(predictions, [e.answers for e in without_passages(self.dev)])
        return {"exact_match": metrics["exact_match"], "f1": metrics["f1"], "n": len(self.dev)}

    def save_model(self, path: Path, every_rank: bool = False) -> None:
        if every_rank:  # sharded: the ranks write the weights together
            export_weights_from_shards(self.model.t5, path)
            if not distributed.is_main():
                return
            self.model.save_config(path)
        else:
            self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        # How the reader was fed: eval-reader and score-passages feed it the same way, and
        # load it as it is built (a kept cross-attention bias, FiDO's sparse decoder).
        ReaderSettings(
            passage_max_tokens=self.cfg.passage_max_tokens,
            n_passages=self.cfg.n_passages,
            target_max_tokens=self.cfg.target_max_tokens,
            cross_attention_bias=has_cross_attention_bias(self.model.t5),
            light_tokens=self.model.light_tokens,
            cross_attention_every=self.model.cross_attention_every,
        ).save(path)

    def fsdp_units(self) -> list[torch.nn.Module]:
        return self.model.fsdp_units()


def _note_variant_change(init_model: str, cfg: ReaderTrainConfig) -> None:
    """Logs where the run fine-tunes the start model into another variant."""
    folder = Path(init_model)
    start = ReaderSettings.load(folder) if folder.is_dir() else ReaderSettings()
    for name in ("light_tokens", "cross_attention_every"):
        before, after = getattr(start, name), getattr(cfg, name)
        if before != after:
            logger.info(
                "fine-tuning %s (%s = %r) with %s = %r", init_model, name, before, name, after
            )


def build_start_reader(init_model: str, cfg: ReaderTrainConfig, device: torch.device):
    """The start reader on `device`. With FSDP over several ranks it is built sharded: on the
    meta device, its blocks sharded, each rank reading only its own slices of the weights, so
    no rank holds the whole model (the point of FSDP for readers one device cannot hold)."""
    variant = dict(light_tokens=cfg.light_tokens, cross_attention_every=cfg.cross_attention_every)
    if cfg.sharding == "fsdp" and distributed.world()[1] > 1:
        built = reader_skeleton(
            init_model, cfg.dropout, encoder_buckets=cfg.encoder_buckets,
            pack_passages=cfg.pack_passages, **variant,
        )  # fmt: skip
        if built is not None:
            reader, tokenizer, folder = built
            sharding.shard(reader, reader.fsdp_units())
            reader.to_empty(device=device)
            reader.t5.tie_weights()  # to_empty gives each user of a tied weight its own copy
            load_weights_into_shards(reader.t5, folder)
            return reader, tokenizer
        logger.warning(
            "%s has no safetensors weights: every rank loads the whole model before sharding "
            "it (save it with save_pretrained to load only each rank's shards)",
            init_model,
        )
    reader, tokenizer = load_reader(
        init_model, cfg.encoder_buckets, cfg.pack_passages, cfg.dropout, **variant
    )
    return reader.to(device), tokenizer


def train_reader(
    cfg: ReaderTrainConfig,
    train_path: Path,
    dev_path: Path,
    init_model: str,
    output_dir: Path,
    state_dir: Path,
    device: torch.device,
    passages_path: Path | None = None,
) -> dict:
    """Trains a reader and writes the chosen model (HF format + tokenizer) to `output_dir`.

    The best dev checkpoint is exported (the final step's model when it is as good), with the
    run's metrics.jsonl and config beside it. Resumes from `state_dir` when it holds a run.
    `passages_path`: the passage store (or TSV) of compact lists; their text is read as
    batches are built.

    Returns:
        The exported model's dev metrics.
    """
    check_reader(init_model)
    # "auto" becomes what it means on this device, in the run's record too
    cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device))
    train = load_examples(train_path, require_answers=True, passages=passages_path)
    dev = load_examples(dev_path, require_answers=True, passages=passages_path)
    logger.info("%d training and %d dev questions", len(train), len(dev))
    # The config says what the trained reader is: a FiD-Light or FiDO variant of the start
    # model is fine-tuned from it (fid.models.reader_variants).
    reader, tokenizer = build_start_reader(init_model, cfg, device)
    _note_variant_change(init_model, cfg)
    reader.set_attention(cfg.attention, device)
    reader.set_activation_checkpointing(cfg.activation_checkpointing)
    task = ReaderTask(reader, tokenizer, cfg, train, dev, device)
    inputs = {"train": train_path, "dev": dev_path}
    return train_and_export(task, cfg, state_dir, output_dir, device, cfg.precision, inputs)
