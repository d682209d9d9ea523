"""Knobs of the embedded demo: the synthetic world (`fid make-demo-data`), and synthetic data of
NQ's shape and size (`fid make-scale-data`).

The world's fixed shape lives here too (its attributes, the most entities, the question
templates per attribute), so that a config is checked without building the world;
fid/demo/world.py holds the templates and checks that they agree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NoReturn

from fid.config.loading import ConfigError, check_finite

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


NQ_PASSAGES = 21_015_324
"""Passages of DPR's Wikipedia corpus (psgs_w100.tsv), the size `ScaleDataConfig.scale` 1.0."""
NQ_QUESTIONS: dict[str, int] = {"train": 79_168, "dev": 8_757, "test": 3_610}
"""Questions per split of NQ-open as FiD and DPR use it, the sizes of `scale` 1.0."""
ARTICLE_PASSAGES = 5
"""Mean passages per synthetic article: consecutive passages share its title, and only the last
may be a short tail, so `tail_fraction` can reach at most 1 / ARTICLE_PASSAGES."""


@dataclass(frozen=True)
class ScaleDataConfig:
    """`fid make-scale-data`: a synthetic corpus and question splits of NQ's shape and size.

    Attributes:
        seed: Seed of every random choice; the same config always gives the same bytes.
        scale: Fraction of NQ, 0 < scale <= 1: 1.0 is 21,015,324 passages and 79,168 train /
            8,757 dev / 3,610 test questions (each count rounded, at least 1).
        n_passages, n_train, n_dev, n_test: Exact counts overriding `scale` for that part
            (None: from `scale`); splits may be 0, the corpus needs >= 1 passage.
        integer_ids: Passage ids 1..N as DPR's; False: string ids "doc{article}-{k}".
        answer_passages: Passages that state each question's answer, verbatim, beside some of
            the question's words (so BM25 can find them); no passage states two answers, so
            n_passages >= (answer_passages + distractor_passages) * questions.
        distractor_passages: Passages that hold some of each question's content words but not
            its answer, so that the words alone do not single out an answer passage (BM25
            ranks an answer passage first less often).
        passage_words: Words of a passage (DPR: 100); only an article's last passage can be
            shorter.
        tail_fraction: Share of passages that are such short tails (uniform 1..passage_words-1
            words), 0..1/ARTICLE_PASSAGES.
    """

    seed: int = 0
    scale: float = 0.01
    n_passages: int | None = None
    n_train: int | None = None
    n_dev: int | None = None
    n_test: int | None = None
    integer_ids: bool = True
    answer_passages: int = 3
    distractor_passages: int = 3
    passage_words: int = 100
    tail_fraction: float = 0.02

    def __post_init__(self) -> None:
        def fail(key: str, expected: str) -> NoReturn:
            value = getattr(self, key)
            raise ConfigError(
                f"ScaleDataConfig.{key} = {value!r} is not allowed: expected {expected}"
            )

        def is_int(value: object) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        for key in ("seed", "answer_passages", "distractor_passages", "passage_words"):
            if not is_int(getattr(self, key)):
                fail(key, "an int")
        for key in ("n_passages", "n_train", "n_dev", "n_test"):
            value = getattr(self, key)
            if value is not None and (not is_int(value) or value < 0):
                fail(key, "null (from scale) or an int >= 0")
        if not isinstance(self.integer_ids, bool):
            fail("integer_ids", "true or false")
        for key in ("scale", "tail_fraction"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                fail(key, "a number")
            check_finite(f"ScaleDataConfig.{key}", value)
        if not 0 < self.scale <= 1:
            fail("scale", "0 < scale <= 1 (1.0 = NQ's 21,015,324 passages)")
        if not 0 <= self.tail_fraction <= 1 / ARTICLE_PASSAGES:
            fail("tail_fraction", f"0 <= tail_fraction <= {1 / ARTICLE_PASSAGES} (1 short tail "
                 f"at most per article of {ARTICLE_PASSAGES} passages on average)")  # fmt: skip
        if self.seed < 0:
            fail("seed", "an int >= 0")
        if not 1 <= self.answer_passages <= 100:
            fail("answer_passages", "1 <= answer_passages <= 100")
        if not 0 <= self.distractor_passages <= 100:
            fail("distractor_passages", "0 <= distractor_passages <= 100")
        if not 10 <= self.passage_words <= 1000:
            fail("passage_words", "10 <= passage_words <= 1000")
        sizes = self.sizes()
        if sizes["passages"] < 1:
            fail("n_passages", "an int >= 1")
        n_questions = sizes["train"] + sizes["dev"] + sizes["test"]
        per_question = self.answer_passages + self.distractor_passages
        if sizes["passages"] < per_question * n_questions:
            raise ConfigError(
                f"ScaleDataConfig.n_passages = {sizes['passages']} is too small: expected "
                f"n_passages >= (answer_passages + distractor_passages) * questions = "
                f"{per_question} * {n_questions} = {per_question * n_questions} (a passage "
                "serves one question); raise scale or n_passages, or lower n_train/n_dev/n_test"
            )

    def sizes(self) -> dict[str, int]:
        """The counts to write: {"passages", "train", "dev", "test"} (overrides, else scaled)."""
        full = {"passages": NQ_PASSAGES, **NQ_QUESTIONS}
        explicit = {
            "passages": self.n_passages,
            "train": self.n_train,
            "dev": self.n_dev,
            "test": self.n_test,
        }
        return {
            key: value if value is not None else max(1, round(self.scale * full[key]))
            for key, value in explicit.items()
        }
