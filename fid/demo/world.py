"""A deterministic synthetic open-domain QA world for the embedded demo.

The world holds a few hundred invented entities ("Valdoria", "Port Kestrel", ...), each with eight
facts (founder, ruler, capital, founding year, flag colour, main export, river, language). Every
fact gets its own passage of about 30-50 words whose title is the entity name. Besides the fact,
a passage holds a "trap" sentence that reuses the wording of a question about *another*
attribute of the same entity (without any answer), a mention of another random entity, and some
filler, so that lexical overlap alone does not find the gold passage.

Answer values come from small shared pools (40 people, 40 cities, 12 colours, ...) so that every
answer token is seen many times in training, and questions paraphrase the passage wording ("Who
established Valdoria?" for "Valdoria was founded by Marta Olsen ..."). Facts, not questions, are
split into train/dev/test, so that dev and test ask about facts never asked about in training.

Everything is a pure function of `WorldConfig`: each random choice comes from a
`random.Random` seeded from the config, and nothing depends on set or hash ordering, so the same
config gives byte-identical files (fid.demo.files). The templates, answer pools and entity-name
parts are in fid.demo.vocabulary.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fid.config.demo import ATTRIBUTES, WorldConfig
from fid.data.passages import Passage
from fid.demo.vocabulary import (
    FILLERS,
    MENTION_TEMPLATES,
    PASSAGE_TEMPLATES,
    QUESTION_TEMPLATES,
    TRAP_TEMPLATES,
    check_vocabulary,
    draw_values,
    make_names,
)

__all__ = ["Question", "World", "build_world"]


@dataclass(frozen=True)
class Question:
    """One question about one fact.

    Attributes:
        id: Question id, "{split}-{index}".
        question: The question text.
        answers: Accepted answers (one value, verbatim in the gold passage).
        gold_passage_id: Id of the passage that states the fact.
        entity: Name of the entity asked about.
        attribute: The attribute asked about, one of `ATTRIBUTES`.
    """

    id: str
    question: str
    answers: list[str]
    gold_passage_id: str
    entity: str
    attribute: str


@dataclass(frozen=True)
class World:
    """A generated corpus and its question splits.

    Attributes:
        passages: All passages; those of entity i are passages[8*i : 8*i + 8] in `ATTRIBUTES`
            order.
        splits: Questions by split name: "train", "dev" and "test".
    """

    passages: list[Passage]
    splits: dict[str, list[Question]]


def _n_words(text: str) -> int:
    return len(text.split())


def _passage_text(
    entity: str, attribute: str, value: str, other_entity: str, rng: random.Random
) -> str:
    """Composes one passage: the fact, a trap, a mention of another entity and filler."""
    fact = rng.choice(PASSAGE_TEMPLATES[attribute]).format(e=entity, v=value)
    trap_attribute = rng.choice([a for a in ATTRIBUTES if a != attribute])
    trap = rng.choice(TRAP_TEMPLATES[trap_attribute]).format(e=entity)
    mention = rng.choice(MENTION_TEMPLATES).format(e=entity, o=other_entity)
    sentences = [fact, trap, mention]
    n_words = sum(_n_words(s) for s in sentences)
    target = rng.randint(32, 48)
    for filler in rng.sample(FILLERS, len(FILLERS)):
        if n_words >= target:
            break
        if n_words + _n_words(filler) > 50:
            continue
        sentences.append(filler)
        n_words += _n_words(filler)
    rng.shuffle(sentences)
    return " ".join(sentences)


def build_world(config: WorldConfig) -> World:
    """Generates the passages and the question splits of a synthetic world.

    Args:
        config: Size and seed of the world.

    Returns:
        The world: `8 * config.n_entities` passages (those of entity i at indices 8i..8i+7, in
        `ATTRIBUTES` order) and the "train", "dev" and "test" question lists. Each
        (entity, attribute) fact is asked about in exactly one split: dev and test with one
        question per fact, train with `config.train_paraphrases` questions per fact, each from a
        different template.

    Raises:
        RuntimeError: If the built-in vocabulary breaks the invariant that an answer occurs in
            its gold passage and in no other passage of its entity (a bug, not a user error).
    """
    check_vocabulary()
    seed = config.seed
    # The streams are named after the module's first name (fid.synthetic): renaming them would
    # change every world.
    names = make_names(config.n_entities, random.Random(f"fid.synthetic:{seed}:names"))
    value_rng = random.Random(f"fid.synthetic:{seed}:values")
    values = [draw_values(value_rng) for _ in names]

    text_rng = random.Random(f"fid.synthetic:{seed}:passages")
    passages: list[Passage] = []
    for e, entity in enumerate(names):
        for attribute in ATTRIBUTES:
            other = names[(e + text_rng.randrange(1, len(names))) % len(names)]
            text = _passage_text(entity, attribute, values[e][attribute], other, text_rng)
            passages.append(Passage(id=f"p{len(passages)}", title=entity, text=text))
        own = passages[-len(ATTRIBUTES) :]
        for a, attribute in enumerate(ATTRIBUTES):
            answer = values[e][attribute]
            for b, passage in enumerate(own):
                found = answer.lower() in passage.text.lower()
                if found != (a == b) or (a == b and answer not in passage.text):
                    raise RuntimeError(
                        f"answer {answer!r} of {entity!r}/{attribute} breaks the invariant in "
                        f"passage {passage.id}: {passage.text!r}"
                    )

    facts = [(e, a) for e in range(len(names)) for a in range(len(ATTRIBUTES))]
    random.Random(f"fid.synthetic:{seed}:splits").shuffle(facts)
    n_dev, n_test = config.n_dev_facts, config.n_test_facts
    split_facts = {
        "train": sorted(facts[n_dev + n_test :]),
        "dev": sorted(facts[:n_dev]),
        "test": sorted(facts[n_dev : n_dev + n_test]),
    }

    question_rng = random.Random(f"fid.synthetic:{seed}:questions")
    splits: dict[str, list[Question]] = {}
    for split, split_fact_list in split_facts.items():
        questions: list[Question] = []
        for e, a in split_fact_list:
            attribute = ATTRIBUTES[a]
            templates = QUESTION_TEMPLATES[attribute]
            n_questions = config.train_paraphrases if split == "train" else 1
            for template in question_rng.sample(templates, n_questions):
                questions.append(
                    Question(
                        id=f"{split}-{len(questions)}",
                        question=template.format(e=names[e]),
                        answers=[values[e][attribute]],
                        gold_passage_id=passages[e * len(ATTRIBUTES) + a].id,
                        entity=names[e],
                        attribute=attribute,
                    )
                )
        splits[split] = questions
    return World(passages=passages, splits=splits)
