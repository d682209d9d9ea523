"""Tests of fid.demo.world: the deterministic synthetic QA world of the embedded demo."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from fid.config import WorldConfig
from fid.config.demo import ATTRIBUTES
from fid.demo.files import reader_examples, write_world
from fid.demo.vocabulary import PASSAGE_TEMPLATES, QUESTION_TEMPLATES, TRAP_TEMPLATES
from fid.demo.world import World, build_world

_STOPWORDS = {
    "a", "an", "and", "are", "at", "by", "did", "do", "does", "for", "from", "in", "is", "it",
    "its", "of", "on", "that", "the", "to", "was", "were", "what", "when", "where", "which",
    "who", "with",
}  # fmt: skip


@pytest.fixture(scope="module")
def world() -> World:
    return build_world(WorldConfig())


@pytest.fixture(scope="module")
def small_world() -> World:
    return build_world(WorldConfig(seed=3, n_entities=20, n_dev_facts=30, n_test_facts=20))


def _passages_by_id(world: World) -> dict:
    return {p.id: p for p in world.passages}


def _content_words(template: str) -> set[str]:
    text = template.replace("{e}", " ").replace("{v}", " ").lower()
    return {w for w in re.findall(r"[a-z]+", text) if w not in _STOPWORDS}


def test_default_sizes(world: World) -> None:
    assert len(world.passages) == 300 * 8
    assert len({p.id for p in world.passages}) == len(world.passages)
    assert len({p.title for p in world.passages}) == 300
    assert {k: len(v) for k, v in world.splits.items()} == {"train": 3600, "dev": 300, "test": 300}
    for split, questions in world.splits.items():
        assert len({q.id for q in questions}) == len(questions), split
    n_words = [len(p.text.split()) for p in world.passages]
    assert min(n_words) >= 30 and max(n_words) <= 50


def test_build_is_deterministic_and_seed_dependent(small_world: World) -> None:
    config = WorldConfig(seed=3, n_entities=20, n_dev_facts=30, n_test_facts=20)
    assert build_world(config) == small_world
    other = build_world(WorldConfig(seed=4, n_entities=20, n_dev_facts=30, n_test_facts=20))
    assert other.passages != small_world.passages
    assert other.splits != small_world.splits


@pytest.mark.parametrize(
    ("n_entities", "n_dev", "n_test", "paraphrases"),
    [(20, 30, 20, 2), (10, 0, 0, 3), (5, 39, 0, 1), (7, 1, 2, 0)],
)
def test_split_sizes_match_config(n_entities: int, n_dev: int, n_test: int, paraphrases: int):
    config = WorldConfig(
        seed=1,
        n_entities=n_entities,
        n_dev_facts=n_dev,
        n_test_facts=n_test,
        train_paraphrases=paraphrases,
    )
    world = build_world(config)
    n_facts = n_entities * len(ATTRIBUTES)
    assert len(world.passages) == n_facts
    assert len(world.splits["dev"]) == n_dev
    assert len(world.splits["test"]) == n_test
    assert len(world.splits["train"]) == (n_facts - n_dev - n_test) * paraphrases


def test_facts_are_split_disjointly(world: World) -> None:
    facts = {
        split: {(q.entity, q.attribute) for q in questions}
        for split, questions in world.splits.items()
    }
    assert len(facts["train"]) == 1800 and len(facts["dev"]) == 300 and len(facts["test"]) == 300
    assert not facts["train"] & facts["dev"]
    assert not facts["train"] & facts["test"]
    assert not facts["dev"] & facts["test"]
    # Every fact of the world is asked about somewhere.
    assert len(facts["train"] | facts["dev"] | facts["test"]) == len(world.passages)


def test_train_paraphrases_use_different_templates(world: World) -> None:
    by_fact: dict[tuple[str, str], list[str]] = {}
    for q in world.splits["train"]:
        by_fact.setdefault((q.entity, q.attribute), []).append(q.question)
    assert all(len(set(qs)) == 2 for qs in by_fact.values())


def test_answer_only_in_gold_passage_of_its_entity(world: World) -> None:
    passages = _passages_by_id(world)
    by_title: dict[str, list] = {}
    for p in world.passages:
        by_title.setdefault(p.title, []).append(p)
    for questions in world.splits.values():
        for q in questions:
            gold = passages[q.gold_passage_id]
            assert gold.title == q.entity
            (answer,) = q.answers
            assert answer in gold.text
            assert answer.lower() not in q.question.lower()
            for p in by_title[q.entity]:
                if p.id != gold.id:
                    assert answer.lower() not in p.text.lower(), (q, p)


def test_answers_come_from_shared_pools(world: World) -> None:
    counts: dict[str, dict[str, int]] = {a: {} for a in ATTRIBUTES}
    for q in world.splits["train"]:
        counts[q.attribute][q.answers[0]] = counts[q.attribute].get(q.answers[0], 0) + 1
    for attribute, per_value in counts.items():
        if attribute != "year":
            assert len(per_value) <= 40, attribute
            assert sum(per_value.values()) / len(per_value) >= 5, attribute
    assert all(1100 <= int(v) <= 1899 for v in counts["year"])


def test_question_templates_paraphrase_passage_templates() -> None:
    for attribute in ATTRIBUTES:
        assert len(QUESTION_TEMPLATES[attribute]) >= 2
        assert len(PASSAGE_TEMPLATES[attribute]) >= 2
        for question in QUESTION_TEMPLATES[attribute]:
            q_words = _content_words(question)
            assert q_words
            for passage in PASSAGE_TEMPLATES[attribute]:
                # No content word, not even a shared 5-letter stem, is common to both.
                p_words = _content_words(passage)
                assert not q_words & p_words, (question, passage)
                assert not {w[:5] for w in q_words} & {w[:5] for w in p_words}, (question, passage)


def test_traps_reuse_question_words(world: World) -> None:
    for attribute in ATTRIBUTES:
        q_words = set().union(*(_content_words(q) for q in QUESTION_TEMPLATES[attribute]))
        for trap in TRAP_TEMPLATES[attribute]:
            assert _content_words(trap) & q_words, trap
    passages = _passages_by_id(world)
    for q in world.splits["dev"]:
        gold = passages[q.gold_passage_id]
        assert q.question.rstrip("?") not in gold.text
        assert q.entity in gold.text


def test_reader_examples(small_world: World) -> None:
    passages = _passages_by_id(small_world)
    for n_passages in (1, 5, 8, 20):
        records = reader_examples(small_world, "dev", n_passages, seed=7)
        assert len(records) == len(small_world.splits["dev"])
        for record, q in zip(records, small_world.splits["dev"], strict=True):
            assert set(record) == {"id", "question", "answers", "gold_passage_id", "ctxs"}
            assert record["id"] == q.id and record["answers"] == q.answers
            ids = [c["id"] for c in record["ctxs"]]
            assert len(ids) == n_passages
            assert len(set(ids)) == n_passages
            assert q.gold_passage_id in ids
            same_entity = sum(passages[i].title == q.entity for i in ids)
            assert same_entity == min(n_passages, 8)
            for c in record["ctxs"]:
                assert set(c) == {"id", "title", "text", "score"}
                assert c["title"] == passages[c["id"]].title
                assert c["text"] == passages[c["id"]].text
                assert isinstance(c["score"], float) and 0.0 <= c["score"] < 1.0
    assert reader_examples(small_world, "dev", 20, seed=7) == records
    assert reader_examples(small_world, "dev", 20, seed=8) != records


def test_reader_examples_gold_position_and_score_are_uninformative(world: World) -> None:
    records = reader_examples(world, "train", 20)
    positions = [[c["id"] for c in r["ctxs"]].index(r["gold_passage_id"]) for r in records]
    assert len(set(positions)) == 20
    top_is_gold = sum(
        max(r["ctxs"], key=lambda c: c["score"])["id"] == r["gold_passage_id"] for r in records
    )
    assert top_is_gold < 0.1 * len(records)


def test_reader_examples_caps_at_corpus_size() -> None:
    tiny = build_world(WorldConfig(n_entities=2, n_dev_facts=1, n_test_facts=1))
    (record,) = reader_examples(tiny, "dev", 100)
    assert sorted(c["id"] for c in record["ctxs"]) == sorted(p.id for p in tiny.passages)


def test_reader_examples_rejects_bad_arguments(small_world: World) -> None:
    with pytest.raises(ValueError, match="split"):
        reader_examples(small_world, "valid", 4)
    with pytest.raises(ValueError, match="n_passages"):
        reader_examples(small_world, "dev", 0)


def test_write_world(small_world: World, tmp_path: Path) -> None:
    out = tmp_path / "world"
    write_world(small_world, out)
    assert sorted(p.name for p in out.iterdir()) == [
        "dev.jsonl",
        "passages.tsv",
        "test.jsonl",
        "train.jsonl",
    ]
    with open(out / "passages.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["id", "text", "title"]
    assert rows[1:] == [[p.id, p.text, p.title] for p in small_world.passages]
    for split, questions in small_world.splits.items():
        lines = (out / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines]
        assert records == [
            {
                "id": q.id,
                "question": q.question,
                "answers": q.answers,
                "gold_passage_id": q.gold_passage_id,
            }
            for q in questions
        ]
    # Same config, byte-identical files.
    again = tmp_path / "again"
    write_world(
        build_world(WorldConfig(seed=3, n_entities=20, n_dev_facts=30, n_test_facts=20)), again
    )
    for name in ("passages.tsv", "train.jsonl", "dev.jsonl", "test.jsonl"):
        assert (out / name).read_bytes() == (again / name).read_bytes()
    # Rewriting in place leaves no temp files behind.
    write_world(small_world, out)
    assert len(list(out.iterdir())) == 4


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"seed": -1}, "seed"),
        ({"n_entities": 1}, "n_entities"),
        ({"n_entities": 10**6}, "n_entities"),
        ({"n_entities": 3.5}, "n_entities"),
        ({"n_dev_facts": -2}, "n_dev_facts"),
        ({"n_test_facts": True}, "n_test_facts"),
        ({"train_paraphrases": -1}, "train_paraphrases"),
        ({"train_paraphrases": 4}, "train_paraphrases"),
        ({"n_entities": 10, "n_dev_facts": 40, "n_test_facts": 40}, "n_dev_facts"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field) as info:
        WorldConfig(**kwargs)
    assert str(next(iter(kwargs.values()))) in str(info.value)
