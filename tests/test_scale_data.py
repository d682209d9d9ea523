"""fid.demo.scale_data: DPR/NQ-shaped synthetic data at any scale (`make_scale_data`)."""

from __future__ import annotations

import csv
import itertools
import json
import math
import re

import pytest

from fid.config import ConfigError, ScaleDataConfig, config_from_dict
from fid.config.demo import NQ_PASSAGES, NQ_QUESTIONS
from fid.data.passages import iter_passages, load_passages
from fid.data.questions import load_questions
from fid.demo import scale_data
from fid.demo.scale_data import FILES, make_scale_data
from fid.metrics.has_answer import AnswerMatcher

SMALL = dict(n_passages=3000, n_train=40, n_dev=10, n_test=10, seed=1)
SPLITS = ("train", "dev", "test")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(config, folder, stats) of a small corpus with DPR's integer ids."""
    cfg = ScaleDataConfig(**SMALL)
    folder = tmp_path_factory.mktemp("scale") / "data"
    return cfg, folder, make_scale_data(cfg, folder)


@pytest.fixture(scope="module")
def passages(written):
    return load_passages(written[1] / "psgs_w100.tsv")


def test_files_parse_with_the_project_readers_and_counts_match(written, passages):
    cfg, folder, stats = written
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)  # no temporaries left
    assert len(passages) == stats["passages"] == 3000
    for split in SPLITS:
        questions = load_questions(folder / f"{split}.jsonl")
        assert len(questions) == stats["questions"][split] == cfg.sizes()[split]
        assert all(set(json.loads(line)) == {"question", "answer"}
                   for line in (folder / f"{split}.jsonl").read_text().splitlines())  # fmt: skip
    on_disk = json.loads((folder / "stats.json").read_text())
    assert on_disk == stats
    assert stats["bytes"] == {name: (folder / name).stat().st_size for name in FILES[:-1]}
    assert stats["answer_passages"] == 60 * cfg.answer_passages
    assert stats["config"]["seed"] == 1


def test_ids_are_unique_and_shaped_for_both_kinds(written, passages, tmp_path):
    # load_passages refuses a repeated id; DPR's ids are 1..N in file order.
    assert list(passages) == [str(i) for i in range(1, 3001)]
    cfg = ScaleDataConfig(**{**SMALL, "integer_ids": False})
    make_scale_data(cfg, tmp_path)
    named = load_passages(tmp_path / "psgs_w100.tsv")
    assert len(named) == 3000
    places = [re.fullmatch(r"doc(\d+)-(\d+)", id_).groups() for id_ in named]
    # An article's passages are consecutive, numbered from 0, and share its title.
    for _, group in itertools.groupby(
        zip(places, named.values(), strict=True), key=lambda x: x[0][0]
    ):
        group = list(group)
        assert [int(k) for (_, k), _ in group] == list(range(len(group)))
        assert len({passage.title for _, passage in group}) == 1
    # The same seed gives the same texts whatever the id kind.
    assert [p.text for p in named.values()] == [p.text for p in passages.values()]


def test_every_answer_is_in_its_passages_next_to_question_words(written, passages):
    cfg, folder, _ = written
    texts = [p.text for p in passages.values()]
    lowered = [t.lower() for t in texts]
    for split in SPLITS:
        for question in load_questions(folder / f"{split}.jsonl"):
            (answer,) = question["answers"]
            assert 1 <= len(answer.split()) <= 3
            matcher = AnswerMatcher([answer])
            hits = [t for t, low in zip(texts, lowered, strict=True)
                    if answer.lower() in low and matcher.matches(t)]  # fmt: skip
            assert len(hits) >= cfg.answer_passages, question
            # Answer passages share at least half of the question's content words (BM25's cue).
            words = set(question["question"].split()) - set(scale_data._STOPWORDS)
            words -= set(scale_data._QUESTION_FILLERS)
            shared = max(len(words & set(re.findall(r"[^\s,.()\"]+", t))) for t in hits)
            assert shared >= math.ceil(len(words) / 2) - 1, (question, words)


def test_bm25_finds_the_answer_passages(written):
    """The planted words make the answer findable, the distractors keep it from being trivial."""
    from fid.config import BM25Config
    from fid.retrieval.bm25 import build_bm25, rank_bm25

    _, folder, _ = written
    cfg = BM25Config(top_k=20)
    build_bm25(folder / "psgs_w100.tsv", folder.parent / "bm25", cfg)
    questions = load_questions(folder / "train.jsonl")
    records = rank_bm25(folder.parent / "bm25", folder / "psgs_w100.tsv", questions, cfg)
    top20 = sum(any(c["has_answer"] for c in r["ctxs"]) for r in records) / len(records)
    top1 = sum(r["ctxs"][0]["has_answer"] for r in records) / len(records)
    assert top20 >= 0.9
    assert top1 < 0.9


def test_quoted_and_tab_texts_round_trip_through_csv(written):
    """Every row is exactly what DPR's quoting gives back for the parsed fields."""
    lines = (written[1] / "psgs_w100.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines[0] == "id\ttext\ttitle\n"
    rows = list(csv.reader(lines[1:], delimiter="\t"))
    assert len(rows) == 3000
    for line, (id_, text, title) in zip(lines[1:], rows, strict=True):
        assert line == f'{id_}\t"{text.replace(chr(34), chr(34) * 2)}"\t{title}\n'
    assert sum('"' in text for _, text, _ in rows) > 100
    assert sum("\t" in text for _, text, _ in rows) > 5
    assert sum(not text.isascii() for _, text, _ in rows) > 100


def test_lengths_titles_and_questions_have_nq_shapes(written, passages):
    cfg, folder, stats = written
    lengths = [len(p.text.split()) for p in passages.values()]
    assert max(lengths) == 100 and min(lengths) >= 1
    short = sum(n < 100 for n in lengths)
    assert short == stats["short_passages"]
    assert 0.005 <= short / len(lengths) <= 0.05  # tail_fraction 0.02: most passages are 100
    titles = [p.title for p in passages.values()]
    assert all(1 <= len(t.split()) <= 4 and t.istitle() for t in titles)
    runs = [len(list(g)) for _, g in itertools.groupby(titles)]
    assert 3 <= len(titles) / len(runs) <= 8  # articles of ~5 passages
    assert stats["articles"] == len(runs)  # (a title can repeat, but not next to itself here)
    questions = [q for s in SPLITS for q in load_questions(folder / f"{s}.jsonl")]
    n_words = [len(q["question"].split()) for q in questions]
    assert 7 <= sum(n_words) / len(n_words) <= 11
    assert all(q["question"] == q["question"].lower() for q in questions)


def test_same_seed_same_bytes_other_seed_other_data(tmp_path):
    base = dict(n_passages=400, n_train=8, n_dev=4, n_test=4)
    folders = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        make_scale_data(ScaleDataConfig(seed=seed, **base), tmp_path / name)
        folders.append(tmp_path / name)
    a, b, c = ({n: (f / n).read_bytes() for n in FILES[:-1]} for f in folders)
    assert a == b
    assert all(a[name] != c[name] for name in FILES[:-1])


def test_outputs_appear_together_or_not_at_all(tmp_path, monkeypatch):
    def fail(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(scale_data, "_plant", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        make_scale_data(ScaleDataConfig(n_passages=100, n_train=2, n_dev=1, n_test=1), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_scale_sets_the_counts_and_explicit_counts_override_it():
    full = ScaleDataConfig(scale=1.0).sizes()
    assert full == {"passages": NQ_PASSAGES, **NQ_QUESTIONS}
    assert full == {"passages": 21_015_324, "train": 79_168, "dev": 8_757, "test": 3_610}
    assert ScaleDataConfig(scale=0.001).sizes() == {
        "passages": 21_015, "train": 79, "dev": 9, "test": 4
    }  # fmt: skip
    sizes = ScaleDataConfig(scale=0.001, n_passages=5000, n_test=0).sizes()
    assert sizes == {"passages": 5000, "train": 79, "dev": 9, "test": 0}


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("scale", 0.0, "0 < scale <= 1"),
        ("scale", 1.5, "0 < scale <= 1"),
        ("scale", math.nan, "not a finite number"),
        ("n_passages", -1, "int >= 0"),
        ("n_train", 2.5, "int >= 0"),
        ("integer_ids", "yes", "true or false"),
        ("answer_passages", 0, "1 <= answer_passages <= 100"),
        ("distractor_passages", -1, "0 <= distractor_passages <= 100"),
        ("passage_words", 5, "10 <= passage_words <= 1000"),
        ("tail_fraction", 0.5, "0 <= tail_fraction <= 0.2"),
        ("seed", -1, "int >= 0"),
    ],
)
def test_bad_values_are_config_errors_naming_the_key(key, value, expected):
    with pytest.raises(ConfigError, match=re.escape(f"ScaleDataConfig.{key} = ")) as error:
        ScaleDataConfig(**{key: value})
    assert expected in str(error.value)


def test_too_few_passages_for_the_questions_is_a_config_error():
    with pytest.raises(ConfigError, match=r"n_passages = 50 is too small.* 6 \* 12 = 72"):
        ScaleDataConfig(n_passages=50, n_train=10, n_dev=1, n_test=1)
    ScaleDataConfig(n_passages=72, n_train=10, n_dev=1, n_test=1)  # just enough


def test_yaml_keys_are_checked_by_the_loader():
    cfg = config_from_dict({"scale": 1, "n_dev": None}, ScaleDataConfig, source="s.yaml")
    assert cfg.scale == 1.0 and isinstance(cfg.scale, float)
    with pytest.raises(ConfigError, match="s.yaml: n_test = 'many' has the wrong type"):
        config_from_dict({"n_test": "many"}, ScaleDataConfig, source="s.yaml")
    with pytest.raises(ConfigError, match="s.yaml: unknown key 'passages'"):
        config_from_dict({"passages": 10}, ScaleDataConfig, source="s.yaml")


def test_a_few_passages_stream_chunk_after_chunk(tmp_path, monkeypatch):
    """Chunks smaller than an article: ids, titles and answers still line up across them."""
    monkeypatch.setattr(scale_data, "CHUNK_PASSAGES", 7)
    cfg = ScaleDataConfig(n_passages=200, n_train=5, n_dev=2, n_test=2, integer_ids=False)
    stats = make_scale_data(cfg, tmp_path)
    passages = list(iter_passages(tmp_path / "psgs_w100.tsv"))
    assert len({p.id for p in passages}) == stats["passages"] == 200
    for split in SPLITS:
        for question in load_questions(tmp_path / f"{split}.jsonl"):
            matcher = AnswerMatcher(question["answers"])
            assert sum(matcher.matches(p.text) for p in passages) >= cfg.answer_passages


def test_the_fid_command_writes_the_files_and_refuses_bad_knobs(tmp_path):
    from fid.cli import main

    config = tmp_path / "scale.yaml"
    config.write_text("n_passages: 300\nn_train: 6\nn_dev: 2\nn_test: 2\n")
    assert main(["make-scale-data", "--config", str(config), "--output", str(tmp_path / "o")]) == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == sorted(FILES)
    config.write_text("scale: 2.0\n")
    assert main(["make-scale-data", "--config", str(config), "--output", str(tmp_path / "x")]) == 1
    assert not (tmp_path / "x").exists()
