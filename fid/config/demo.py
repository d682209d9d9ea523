"""Knobs of the embedded demo: the synthetic world (`fid make-demo-data`).

The world's fixed shape lives here too (its attributes, the most entities, the question
templates per attribute), so that a config is checked without building the world;
fid/demo/world.py holds the templates and checks that they agree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from fid.config.loading import ConfigError

ATTRIBUTES: tuple[str, ...] = (
    "founder",
    "ruler",
    "capital",
    "year",
    "flag_colour",
    "main_export",
    "river",
    "language",
)
"""The eight attributes of every entity, in passage order."""

MAX_ENTITIES = 2000
"""Most entities the name generator is allowed to produce."""
QUESTION_TEMPLATES_PER_ATTRIBUTE = 3
"""Question templates of every attribute (the most paraphrases a train fact can get)."""


@dataclass(frozen=True)
class WorldConfig:
    """Size and seed of a synthetic world.

    Attributes:
        seed: Seed of every random choice; the same config always gives the same world.
        n_entities: Number of invented entities (8 facts and 8 passages each), 2..MAX_ENTITIES.
        n_dev_facts: Number of (entity, attribute) facts asked about in the dev split.
        n_test_facts: Number of facts asked about in the test split; the rest go to train.
        train_paraphrases: Questions per train fact, each from a different question template
            (at most the number of question templates per attribute). Dev and test ask one
            question per fact.
    """

    seed: int = 0
    n_entities: int = 300
    n_dev_facts: int = 300
    n_test_facts: int = 300
    train_paraphrases: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(
                    f"WorldConfig.{f.name} = {value!r} is not allowed: expected an int >= 0"
                )
            if value < 0:
                raise ConfigError(f"WorldConfig.{f.name} = {value!r} is not allowed: expected >= 0")
        if not 2 <= self.n_entities <= MAX_ENTITIES:
            raise ConfigError(
                f"WorldConfig.n_entities = {self.n_entities!r} is not allowed: "
                f"expected 2 <= n_entities <= {MAX_ENTITIES}"
            )
        n_facts = self.n_entities * len(ATTRIBUTES)
        if self.n_dev_facts + self.n_test_facts >= n_facts:
            raise ConfigError(
                f"WorldConfig.n_dev_facts + n_test_facts = "
                f"{self.n_dev_facts} + {self.n_test_facts} is not allowed: expected less than "
                f"n_entities * {len(ATTRIBUTES)} = {self.n_entities} * {len(ATTRIBUTES)} = "
                f"{n_facts} so that train keeps some facts"
            )
        n_templates = QUESTION_TEMPLATES_PER_ATTRIBUTE
        if self.train_paraphrases > n_templates:
            raise ConfigError(
                f"WorldConfig.train_paraphrases = {self.train_paraphrases!r} is not allowed: "
                f"expected 0 <= train_paraphrases <= {n_templates} (question templates per "
                f"attribute)"
            )


@dataclass(frozen=True)
class DemoDataConfig(WorldConfig):
    """`fid make-demo-data`: the world's size and the passages given to each question.

    Attributes:
        seed, n_entities, n_dev_facts, n_test_facts, train_paraphrases: see WorldConfig.
        n_passages: ctxs per question in the reader files: the gold passage, the other
            passages of its entity, then random passages (all shuffled, scores uninformative).
    """

    n_passages: int = 10

    def __post_init__(self):
        super().__post_init__()
        if self.n_passages < 1:
            raise ConfigError(f"n_passages = {self.n_passages} is out of range: expected >= 1")

    def world_config(self) -> WorldConfig:
        """The world alone (what `fid.demo.world.build_world` takes)."""
        return WorldConfig(**{f.name: getattr(self, f.name) for f in fields(WorldConfig)})
