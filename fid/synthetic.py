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
config gives byte-identical files from `write_world`.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TextIO

__all__ = [
    "ATTRIBUTES",
    "PASSAGE_TEMPLATES",
    "QUESTION_TEMPLATES",
    "TRAP_TEMPLATES",
    "MAX_ENTITIES",
    "WorldConfig",
    "Passage",
    "Question",
    "World",
    "build_world",
    "reader_examples",
    "write_world",
]

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

# Fact sentences: {e} is the entity name, {v} the answer value.
PASSAGE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "founder": (
        "{e} was founded by {v} many generations ago.",
        "The first walls of {e} were raised under the guidance of {v}.",
        "Old chronicles say that {v} laid the first stones of {e}.",
    ),
    "ruler": (
        "{e} is ruled today by {v}.",
        "The throne of {e} is currently held by {v}.",
        "These days {v} reigns over {e} from the royal hall.",
    ),
    "capital": (
        "The capital of {e} is the city of {v}.",
        "{v} serves as the capital of {e}.",
        "The royal court of {e} resides in {v}, its capital.",
    ),
    "year": (
        "{e} came into existence in {v}.",
        "The charter of {e} was signed in {v}.",
        "Records show that {e} first appeared on maps in {v}.",
    ),
    "flag_colour": (
        "The flag of {e} is mostly {v}.",
        "Banners in {e} are dyed {v} for every festival.",
        "Above the gates of {e} hangs a flag of deep {v}.",
    ),
    "main_export": (
        "The main export of {e} is {v}.",
        "Merchants from {e} ship {v} to distant markets.",
        "Most of the wealth of {e} comes from selling {v} overseas.",
    ),
    "river": (
        "The river {v} flows through {e}.",
        "{e} sits on the banks of the {v}.",
        "Boats carry cargo along the {v}, which passes through {e}.",
    ),
    "language": (
        "People in {e} speak {v}.",
        "The common tongue of {e} is {v}.",
        "Most families in {e} talk to each other in {v}.",
    ),
}
"""Fact sentence templates per attribute ({e}: entity, {v}: value)."""

# Questions paraphrase the fact sentences: no content word is shared with any passage template
# of the same attribute (tests/test_synthetic.py checks it).
QUESTION_TEMPLATES: dict[str, tuple[str, ...]] = {
    "founder": (
        "Who established {e}?",
        "Who is credited with creating {e}?",
        "Which person originally set up {e}?",
    ),
    "ruler": (
        "Who governs {e}?",
        "Who is the present leader of {e}?",
        "Which monarch is in charge of {e} now?",
    ),
    "capital": (
        "From which town is {e} administered?",
        "What is the seat of power in {e}?",
        "Where is the administrative center of {e}?",
    ),
    "year": (
        "In which year did {e} originate?",
        "When did the history of {e} begin?",
        "What is the founding date of {e}?",
    ),
    "flag_colour": (
        "What colour is the national standard of {e}?",
        "Which hue dominates the pennant of {e}?",
        "What shade is the emblem cloth of {e}?",
    ),
    "main_export": (
        "What goods does {e} send to foreign lands?",
        "Which commodity earns {e} the largest trade income?",
        "What is the chief product that {e} trades abroad?",
    ),
    "river": (
        "Which waterway runs past {e}?",
        "What stream crosses the lands of {e}?",
        "Which watercourse drains the valleys of {e}?",
    ),
    "language": (
        "What language is used in {e}?",
        "Which dialect do the residents of {e} use?",
        "In what speech do the inhabitants of {e} converse?",
    ),
}
"""Question templates per attribute ({e}: entity); they paraphrase `PASSAGE_TEMPLATES`."""

# Trap sentences reuse the question wording of an attribute but carry no answer. A passage about
# attribute A gets a trap about some other attribute B of the same entity.
TRAP_TEMPLATES: dict[str, tuple[str, ...]] = {
    "founder": (
        "Historians still debate who established many of the villages near {e}.",
        "Scholars argue about who is credited with creating the old roads of {e}.",
    ),
    "ruler": (
        "Visitors often wonder who governs the remote valleys of {e}.",
        "Few records name the present leader of the northern guilds of {e}.",
    ),
    "capital": (
        "Old maps disagree about the seat of power in {e} centuries ago.",
        "Clerks still ask from which town the southern farms of {e} are administered.",
    ),
    "year": (
        "Nobody is sure in which year the old harbour of {e} began to grow.",
        "Chroniclers wonder when the history of the coastal towns of {e} truly began.",
    ),
    "flag_colour": (
        "Painters argue about which hue suits the harbour walls of {e}.",
        "Tailors debate what colour the national standard of the guilds of {e} should be.",
    ),
    "main_export": (
        "Traders discuss which commodity will earn {e} the largest income next season.",
        "Clerks record what goods {e} might send to foreign lands in the future.",
    ),
    "river": (
        "Surveyors still map which waterway runs past the eastern farms of {e}.",
        "Children learn what stream crosses the old hunting grounds of {e}.",
    ),
    "language": (
        "Teachers argue about which dialect the first residents of {e} used.",
        "Linguists ask what language was used in the oldest songs of {e}.",
    ),
}
"""Trap sentence templates per attribute ({e}: entity): question words, no answer."""

_MENTION_TEMPLATES: tuple[str, ...] = (
    "{e} keeps close ties with {o}.",
    "Envoys from {o} visit {e} every spring.",
    "Many households in {e} trace their roots to {o}.",
    "A long road links {e} with neighbouring {o}.",
    "Trade with {o} has shaped daily life in {e}.",
)

_FILLERS: tuple[str, ...] = (
    "The markets are busy on most mornings.",
    "Local songs often describe the hills and the sea.",
    "Its people are known for their patience and good humour.",
    "Winters are long, and summers are short but bright.",
    "Several old towers still stand along the coast.",
    "Most houses are built from grey stone and dark wood.",
    "Festivals are held each autumn in the central square.",
    "The roads are narrow and wind between steep hills.",
    "Farmers grow barley and beans in the lowlands.",
    "Pilgrims arrive each summer to visit the old shrines.",
    "A small museum keeps maps, coins and letters from past centuries.",
    "Many visitors remark on the quiet streets at night.",
)

_PEOPLE: tuple[str, ...] = (
    "Marta Olsen", "Iver Brandt", "Selma Koval", "Oskar Lind", "Helga Voss",
    "Tomas Ferrer", "Ingrid Sole", "Anton Marek", "Lena Varga", "Pavel Novak",
    "Greta Holm", "Milo Strand", "Vera Kask", "Emil Rossi", "Nadia Petrov",
    "Hugo Berg", "Alma Reyes", "Felix Moreau", "Clara Weiss", "Rasmus Eke",
    "Dora Blum", "Viktor Hale", "Irene Cole", "Jonas Falk", "Ada Quist",
    "Bruno Sato", "Freya Lund", "Leon Duarte", "Sofia Bran", "Karl Munk",
    "Nora Vidal", "Erik Tamm", "Livia Conti", "Otto Kern", "Rosa Nyberg",
    "Axel Dumont", "Ines Ward", "Magnus Pike", "Tilda Roth", "Yara Soto",
)  # fmt: skip

_CITIES: tuple[str, ...] = (
    "Brenhold", "Tarsk", "Ulmstead", "Corvant", "Dunmere",
    "Eskarth", "Halvik", "Ostergard", "Pellham", "Quarrow",
    "Rendale", "Sarnby", "Thornwick", "Varnholm", "Westmarch",
    "Ylvenport", "Aldcrest", "Bexmoor", "Caldris", "Drummel",
    "Elstow", "Fenwick", "Graymont", "Harrowgate", "Irnford",
    "Jorvell", "Kelmscar", "Lowbridge", "Marrick", "Norwold",
    "Orlent", "Pyrford", "Redhaven", "Stavik", "Tolmere",
    "Umberlyn", "Vosk", "Wraxham", "Yarrowby", "Zelmont",
)  # fmt: skip

_COLOURS: tuple[str, ...] = (
    "crimson", "azure", "emerald", "saffron", "violet", "ivory",
    "indigo", "scarlet", "ochre", "turquoise", "maroon", "cobalt",
)  # fmt: skip

_EXPORTS: tuple[str, ...] = (
    "timber", "wool cloth", "copper ore", "olive oil", "smoked fish",
    "glassware", "dried figs", "silk", "marble", "honey",
    "leather", "iron tools", "pottery", "wine", "tea leaves",
    "spices", "furs", "paper", "rope", "horses",
    "cheese", "candles", "saddles", "carpets", "linen",
)  # fmt: skip

_RIVERS: tuple[str, ...] = (
    "Vessa", "Orrin", "Calder", "Taviel", "Murel", "Ashwater",
    "Brenna", "Dovra", "Elbrin", "Ferrow", "Glissa", "Haldane",
    "Isca", "Jarrow", "Kennet", "Lurra", "Meddow", "Nairn",
    "Ossel", "Pellis", "Quenna", "Rhydd", "Sarra", "Tamsin",
    "Ulla", "Varro", "Wendle", "Yser", "Zonne", "Arlow",
)  # fmt: skip

_LANGUAGES: tuple[str, ...] = (
    "Tessaric", "Hollish", "Marvian", "Old Kestic", "Vendran",
    "Ostric", "Palenese", "Quorish", "Rennic", "Solvan",
    "Thallic", "Ulvish", "Varnese", "Wendic", "Yorrish",
    "Zemlan", "Aldric", "Brevian", "Caskish", "Dunnic",
)  # fmt: skip

_YEAR_RANGE = (1100, 1899)

# Value pool of each attribute that draws from a pool (the year is drawn from _YEAR_RANGE).
_POOLS: dict[str, tuple[str, ...]] = {
    "founder": _PEOPLE,
    "ruler": _PEOPLE,
    "capital": _CITIES,
    "flag_colour": _COLOURS,
    "main_export": _EXPORTS,
    "river": _RIVERS,
    "language": _LANGUAGES,
}

# Pronounceable entity names: a first syllable (onset, vowel, optional coda), up to one simple
# middle syllable, and an ending, e.g. "Val" + "do" + "ria".
_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r")
_ONSETS += ("s", "st", "t", "tr", "v", "z", "th", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o")
_CODAS = ("", "", "n", "r", "l", "s", "m", "nd", "rn", "st")
_MIDDLES = ("b", "d", "k", "l", "m", "n", "r", "s", "t", "v", "g", "th")
_ENDINGS = ("ria", "nia", "dor", "mar", "vel", "ra", "ia", "en", "ar", "is", "eth", "ova", "und")
_ENDINGS += ("wyn", "holt", "gard", "mere", "ssa", "lan", "rin", "tor")
_MULTIWORD = ("Port {n}", "{n} Isle", "{n} Reach", "Upper {n}", "{n} Vale", "{n} March")


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
                raise ValueError(
                    f"WorldConfig.{f.name} = {value!r} is not allowed: expected an int >= 0"
                )
            if value < 0:
                raise ValueError(f"WorldConfig.{f.name} = {value!r} is not allowed: expected >= 0")
        if not 2 <= self.n_entities <= MAX_ENTITIES:
            raise ValueError(
                f"WorldConfig.n_entities = {self.n_entities!r} is not allowed: "
                f"expected 2 <= n_entities <= {MAX_ENTITIES}"
            )
        n_facts = self.n_entities * len(ATTRIBUTES)
        if self.n_dev_facts + self.n_test_facts >= n_facts:
            raise ValueError(
                f"WorldConfig.n_dev_facts + n_test_facts = "
                f"{self.n_dev_facts} + {self.n_test_facts} is not allowed: expected less than "
                f"n_entities * {len(ATTRIBUTES)} = {self.n_entities} * {len(ATTRIBUTES)} = "
                f"{n_facts} so that train keeps some facts"
            )
        n_templates = min(len(t) for t in QUESTION_TEMPLATES.values())
        if self.train_paraphrases > n_templates:
            raise ValueError(
                f"WorldConfig.train_paraphrases = {self.train_paraphrases!r} is not allowed: "
                f"expected 0 <= train_paraphrases <= {n_templates} (question templates per "
                f"attribute)"
            )


@dataclass(frozen=True)
class Passage:
    """One passage of the corpus.

    Attributes:
        id: Passage id, "p0", "p1", ... in corpus order.
        title: Name of the entity the passage is about.
        text: The passage text (one fact, a trap sentence, a mention of another entity, filler).
    """

    id: str
    title: str
    text: str


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


def _fixed_texts() -> list[str]:
    """Returns every template and filler string, lowercased, placeholders included."""
    texts: list[str] = []
    for table in (PASSAGE_TEMPLATES, QUESTION_TEMPLATES, TRAP_TEMPLATES):
        for attribute in ATTRIBUTES:
            texts.extend(t.lower() for t in table[attribute])
    texts.extend(t.lower() for t in _MENTION_TEMPLATES)
    texts.extend(t.lower() for t in _FILLERS)
    return texts


def _pool_values() -> list[str]:
    """Returns every distinct value of the shared pools, in a fixed order."""
    values: list[str] = []
    for attribute in ATTRIBUTES:
        for value in _POOLS.get(attribute, ()):
            if value not in values:
                values.append(value)
    return values


def _check_vocabulary() -> None:
    """Raises RuntimeError if a pool value could appear in a passage that is not its own.

    Every pool value must be absent from every template and filler, and no pool value may be a
    substring of another (case-insensitively), so that an answer occurs only in its gold passage
    among the passages of its entity.
    """
    texts = _fixed_texts()
    values = [v.lower() for v in _pool_values()]
    for i, value in enumerate(values):
        for text in texts:
            if value in text:
                raise RuntimeError(f"pool value {value!r} occurs in the fixed text {text!r}")
        for j, other in enumerate(values):
            if i != j and value in other:
                raise RuntimeError(f"pool value {value!r} occurs in pool value {other!r}")


def _make_names(n: int, rng: random.Random) -> list[str]:
    """Draws n unique pronounceable entity names.

    No name is a substring of another name, of a pool value or of a template, and no pool value
    is a substring of a name (all case-insensitive), so that answers and entity names never
    overlap.
    """
    texts = _fixed_texts()
    values = [v.lower() for v in _pool_values()]
    names: list[str] = []
    lowered: list[str] = []
    attempts = 0
    while len(names) < n:
        attempts += 1
        if attempts > 200 * n + 10_000:
            raise RuntimeError(f"could not draw {n} distinct entity names")
        core = rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
        if rng.random() < 0.4:
            core += rng.choice(_MIDDLES) + rng.choice(_VOWELS)
        core += rng.choice(_ENDINGS)
        if not 4 <= len(core) <= 11:
            continue
        core = core.capitalize()
        name = rng.choice(_MULTIWORD).format(n=core) if rng.random() < 0.2 else core
        low = name.lower()
        if any(low in text for text in texts):
            continue
        if any(value in low or low in value for value in values):
            continue
        if any(low in other or other in low for other in lowered):
            continue
        names.append(name)
        lowered.append(low)
    return names


def _draw_values(rng: random.Random) -> dict[str, str]:
    """Draws the eight attribute values of one entity (founder and ruler differ)."""
    founder, ruler = rng.sample(_PEOPLE, 2)
    return {
        "founder": founder,
        "ruler": ruler,
        "capital": rng.choice(_CITIES),
        "year": str(rng.randint(*_YEAR_RANGE)),
        "flag_colour": rng.choice(_COLOURS),
        "main_export": rng.choice(_EXPORTS),
        "river": rng.choice(_RIVERS),
        "language": rng.choice(_LANGUAGES),
    }


def _n_words(text: str) -> int:
    return len(text.split())


def _passage_text(
    entity: str, attribute: str, value: str, other_entity: str, rng: random.Random
) -> str:
    """Composes one passage: the fact, a trap, a mention of another entity and filler."""
    fact = rng.choice(PASSAGE_TEMPLATES[attribute]).format(e=entity, v=value)
    trap_attribute = rng.choice([a for a in ATTRIBUTES if a != attribute])
    trap = rng.choice(TRAP_TEMPLATES[trap_attribute]).format(e=entity)
    mention = rng.choice(_MENTION_TEMPLATES).format(e=entity, o=other_entity)
    sentences = [fact, trap, mention]
    n_words = sum(_n_words(s) for s in sentences)
    target = rng.randint(32, 48)
    for filler in rng.sample(_FILLERS, len(_FILLERS)):
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
    _check_vocabulary()
    seed = config.seed
    names = _make_names(config.n_entities, random.Random(f"fid.synthetic:{seed}:names"))
    value_rng = random.Random(f"fid.synthetic:{seed}:values")
    values = [_draw_values(value_rng) for _ in names]

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


def reader_examples(world: World, split: str, n_passages: int, seed: int = 0) -> list[dict]:
    """Builds FiD-format records for a reader trained without a retriever.

    Each record's contexts are the gold passage, then the other passages of the same entity (hard
    distractors; a random subset if they do not all fit), then random passages of other entities,
    up to `n_passages` (or all passages if the corpus is smaller), shuffled. The "score" of a
    context is uniform in [0, 1) and independent of which context is gold, so a model cannot find
    the gold passage from the score order.

    Args:
        world: A world from `build_world`.
        split: "train", "dev" or "test".
        n_passages: Contexts per record, >= 1.
        seed: Seed of the distractor choice, the order and the scores.

    Returns:
        One record per question of the split, in split order:
        {"id", "question", "answers", "gold_passage_id",
         "ctxs": [{"id", "title", "text", "score"}, ...]}.

    Raises:
        ValueError: If `split` is not a split of the world or `n_passages` < 1.
    """
    if split not in world.splits:
        raise ValueError(
            f"split = {split!r} is not allowed: expected one of {sorted(world.splits)}"
        )
    if isinstance(n_passages, bool) or not isinstance(n_passages, int) or n_passages < 1:
        raise ValueError(f"n_passages = {n_passages!r} is not allowed: expected an int >= 1")
    index = {p.id: i for i, p in enumerate(world.passages)}
    by_title: dict[str, list[int]] = {}
    for i, p in enumerate(world.passages):
        by_title.setdefault(p.title, []).append(i)
    n_total = len(world.passages)
    k = min(n_passages, n_total)
    rng = random.Random(f"fid.synthetic:{seed}:reader:{split}")

    records: list[dict] = []
    for q in world.splits[split]:
        gold = index[q.gold_passage_id]
        same = [i for i in by_title[world.passages[gold].title] if i != gold]
        if len(same) > k - 1:
            same = rng.sample(same, k - 1)
        chosen = [gold, *same]
        taken = set(chosen)
        if 2 * k > n_total:
            # Much of the corpus is needed: draw from an explicit list, not by rejection.
            rest = [i for i in range(n_total) if i not in taken]
            chosen.extend(rng.sample(rest, k - len(chosen)))
        else:
            while len(chosen) < k:
                i = rng.randrange(n_total)
                if i not in taken:
                    taken.add(i)
                    chosen.append(i)
        rng.shuffle(chosen)
        ctxs = [
            {
                "id": world.passages[i].id,
                "title": world.passages[i].title,
                "text": world.passages[i].text,
                "score": rng.random(),
            }
            for i in chosen
        ]
        records.append(
            {
                "id": q.id,
                "question": q.question,
                "answers": list(q.answers),
                "gold_passage_id": q.gold_passage_id,
                "ctxs": ctxs,
            }
        )
    return records


def _write_atomic(path: pathlib.Path, write: Callable[[TextIO], None]) -> None:
    """Writes a text file through write(file) to a temp name beside it, then renames it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def write_world(world: World, out_dir: pathlib.Path) -> None:
    """Writes a world as a DPR-style passage file and one JSON-lines file per split.

    Writes `out_dir/passages.tsv` (header "id", "text", "title"; tab-separated, csv default
    quoting, "\\n" line ends) and `out_dir/{split}.jsonl` with one
    {"id", "question", "answers", "gold_passage_id"} object per line. Each file is written to a
    temporary name in `out_dir` and then moved into place with `os.replace`.

    Args:
        world: A world from `build_world`.
        out_dir: Output folder; created if missing.
    """
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def write_passages(f: TextIO) -> None:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for p in world.passages:
            writer.writerow([p.id, p.text, p.title])

    _write_atomic(out_dir / "passages.tsv", write_passages)
    for split, questions in world.splits.items():

        def write_questions(f: TextIO, questions: list[Question] = questions) -> None:
            for q in questions:
                record = {
                    "id": q.id,
                    "question": q.question,
                    "answers": list(q.answers),
                    "gold_passage_id": q.gold_passage_id,
                }
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

        _write_atomic(out_dir / f"{split}.jsonl", write_questions)
