"""The demo world's fixed vocabulary: sentence templates, answer pools, entity-name parts.

Answer values come from small shared pools (40 people, 40 cities, 12 colours, ...) so that every
answer token is seen many times in training; questions paraphrase the passage wording. Nothing
here is random: fid.demo.world draws from these with seeded generators.
"""

from __future__ import annotations

import random

from fid.config.demo import ATTRIBUTES, QUESTION_TEMPLATES_PER_ATTRIBUTE

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

MENTION_TEMPLATES: tuple[str, ...] = (
    "{e} keeps close ties with {o}.",
    "Envoys from {o} visit {e} every spring.",
    "Many households in {e} trace their roots to {o}.",
    "A long road links {e} with neighbouring {o}.",
    "Trade with {o} has shaped daily life in {e}.",
)

FILLERS: tuple[str, ...] = (
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


def fixed_texts() -> list[str]:
    """Returns every template and filler string, lowercased, placeholders included."""
    texts: list[str] = []
    for table in (PASSAGE_TEMPLATES, QUESTION_TEMPLATES, TRAP_TEMPLATES):
        for attribute in ATTRIBUTES:
            texts.extend(t.lower() for t in table[attribute])
    texts.extend(t.lower() for t in MENTION_TEMPLATES)
    texts.extend(t.lower() for t in FILLERS)
    return texts


def pool_values() -> list[str]:
    """Returns every distinct value of the shared pools, in a fixed order."""
    values: list[str] = []
    for attribute in ATTRIBUTES:
        for value in _POOLS.get(attribute, ()):
            if value not in values:
                values.append(value)
    return values


def check_vocabulary() -> None:
    """Raises RuntimeError if a pool value could appear in a passage that is not its own.

    Every pool value must be absent from every template and filler, and no pool value may be a
    substring of another (case-insensitively), so that an answer occurs only in its gold passage
    among the passages of its entity.
    """
    # WorldConfig checks paraphrase counts against this number without building a world.
    if {len(t) for t in QUESTION_TEMPLATES.values()} != {QUESTION_TEMPLATES_PER_ATTRIBUTE}:
        raise RuntimeError("every attribute needs QUESTION_TEMPLATES_PER_ATTRIBUTE templates")
    texts = fixed_texts()
    values = [v.lower() for v in pool_values()]
    for i, value in enumerate(values):
        for text in texts:
            if value in text:
                raise RuntimeError(f"pool value {value!r} occurs in the fixed text {text!r}")
        for j, other in enumerate(values):
            if i != j and value in other:
                raise RuntimeError(f"pool value {value!r} occurs in pool value {other!r}")


def make_names(n: int, rng: random.Random) -> list[str]:
    """Draws n unique pronounceable entity names.

    No name is a substring of another name, of a pool value or of a template, and no pool value
    is a substring of a name (all case-insensitive), so that answers and entity names never
    overlap.
    """
    texts = fixed_texts()
    values = [v.lower() for v in pool_values()]
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


def draw_values(rng: random.Random) -> dict[str, str]:
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
