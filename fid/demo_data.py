"""The embedded demo's data: the synthetic world written as passages and FiD-format questions."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from fid.config import ConfigError
from fid.fileio import atomic_directory, atomic_write_json
from fid.synthetic import WorldConfig, build_world, reader_examples, write_world

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoDataConfig:
    """`fid make-demo-data`: the world's size and the passages given to each question.

    Attributes:
        seed, n_entities, n_dev_facts, n_test_facts, train_paraphrases: see WorldConfig.
        n_passages: ctxs per question in the reader files: the gold passage, the other
            passages of its entity, then random passages (all shuffled, scores uninformative).
    """

    seed: int = 0
    n_entities: int = 300
    n_dev_facts: int = 300
    n_test_facts: int = 300
    train_paraphrases: int = 2
    n_passages: int = 10

    def __post_init__(self):
        if self.n_passages < 1:
            raise ConfigError(f"n_passages = {self.n_passages} is out of range: expected >= 1")
        try:
            self.world_config()
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def world_config(self) -> WorldConfig:
        return WorldConfig(
            seed=self.seed,
            n_entities=self.n_entities,
            n_dev_facts=self.n_dev_facts,
            n_test_facts=self.n_test_facts,
            train_paraphrases=self.train_paraphrases,
        )


def write_demo_data(cfg: DemoDataConfig, output: Path) -> None:
    """Writes passages.tsv, {split}.jsonl (questions) and reader/{split}.json (FiD format)."""
    world = build_world(cfg.world_config())
    with atomic_directory(output) as tmp:
        write_world(world, tmp)
        for split in world.splits:
            records = reader_examples(world, split, cfg.n_passages, seed=cfg.seed)
            atomic_write_json(tmp / "reader" / f"{split}.json", records)
    sizes = {split: len(questions) for split, questions in world.splits.items()}
    logger.info("wrote %d passages and questions %s to %s", len(world.passages), sizes, output)
