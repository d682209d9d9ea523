"""Compact retrieval lists and the passage store: exact text by id, lossless conversion, the same
results as FiD json, and one clear error for each bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import SAMPLES, write_json

from fid.cli import main
from fid.data.examples import ListExamples, load_examples
from fid.data.list_conversion import convert_lists
from fid.data.passage_store import build_passage_store, open_passages, open_store
from fid.data.passages import load_passages
from fid.data.retrieval_lists import lists_from_records, read_lists, write_lists
from fid.errors import DataError

SQUAD_PASSAGES = SAMPLES / "squad-open-tiny" / "psgs_w100.tsv"


def _write_tsv(path: Path, passages) -> Path:
    """A DPR TSV (id, text, title) written with csv quoting, as DPR's files are."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for passage in passages:
            writer.writerow([passage.id, passage.text, passage.title])
    return path


@pytest.fixture(scope="module")
def toy_corpus(tmp_path_factory, toy_world):
    """The toy world's passages as a TSV and its store."""
    folder = tmp_path_factory.mktemp("corpus")
    tsv = _write_tsv(folder / "psgs.tsv", toy_world.passages)
    build_passage_store(tsv, folder / "store")
    return tsv, folder / "store"


def _compact(tmp_path: Path, records: list[dict], store: Path, name: str) -> Path:
    fid_json = write_json(tmp_path / f"{name}.json", records)
    convert_lists(fid_json, store, tmp_path / f"{name}.jsonl")
    return tmp_path / f"{name}.jsonl"


def test_store_returns_the_tsv_text_for_every_id(tmp_path):
    """Integer ids (squad-open-tiny), and string ids with quotes, tabs and long ids."""
    quoted = [
        type("P", (), dict(id=f"doc-{i}:{'x' * (i % 40)}", title=f'T "{i}"', text=f'a\t"b" {i}'))
        for i in range(300)
    ]
    for tsv in (SQUAD_PASSAGES, _write_tsv(tmp_path / "quoted.tsv", quoted)):
        expected = load_passages(tsv)
        build_passage_store(tsv, tmp_path / f"store-{tsv.stem}")
        store = open_store(tmp_path / f"store-{tsv.stem}")
        ids = list(expected)[::-1]  # any order
        assert store.get(ids) == [expected[i] for i in ids]
        assert len(store) == len(expected)


def test_lists_round_trip_losslessly(tmp_path, toy_records, toy_corpus):
    tsv, store = toy_corpus
    records = [dict(r) for r in toy_records["dev"]]
    records[0] = {**records[0], "target": "t", "extra": {"k": [1, 2]}}
    records[1] = {**records[1], "ctxs": [dict(c, has_answer=i % 2 == 0, reader_score=None if i else
                                             1.5) for i, c in enumerate(records[1]["ctxs"])]}  # fmt: skip
    compact = _compact(tmp_path, records, store, "dev")
    for passages in (store, tsv):
        convert_lists(compact, passages, tmp_path / "back.json")
        assert json.loads((tmp_path / "back.json").read_text()) == records
    # compact -> memory -> compact: the same lines
    write_lists(tmp_path / "again.jsonl", read_lists(compact))
    lines = [json.loads(line) for line in compact.read_text().splitlines()]
    assert [
        json.loads(line) for line in (tmp_path / "again.jsonl").read_text().splitlines()
    ] == lines
    assert len(compact.read_bytes()) < len((tmp_path / "dev.json").read_bytes()) / 3


def test_compact_examples_are_the_fid_examples(tmp_path, toy_records, toy_corpus):
    tsv, store = toy_corpus
    compact = _compact(tmp_path, toy_records["dev"], store, "dev")
    examples = load_examples(compact, passages=open_store(store))
    assert isinstance(examples, ListExamples)
    expected = load_examples(tmp_path / "dev.json")
    assert len(examples) == len(expected)
    for got, want in zip(examples, expected, strict=True):
        assert (got.id, got.question, got.answers, got.ctxs) == (
            want.id, want.question, want.answers, want.ctxs
        )  # fmt: skip
    view = examples[2:5].subset([2, 0])
    assert [e.id for e in view] == [expected[4].id, expected[2].id]
    assert [e.id for e in view[1:]] == [expected[2].id]  # a slice of a view


def _fid_run(tmp_path: Path, name: str, questions: Path, model: Path, passages=()) -> dict:
    """eval-reader and score-passages on `questions`; their outputs."""
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"n_passages": 3, "max_new_tokens": 3, "eval_batch_size": 2}))
    score = tmp_path / "score.yaml"
    score.write_text(yaml.safe_dump({"n_passages": 3, "batch_size": 2}))
    extra = ["--passages", str(passages)] if passages else []
    out = tmp_path / name
    assert main(["eval-reader", "--config", str(config), "--model", str(model), "--questions",
                 str(questions), "--predictions", str(out / "p.jsonl"), "--metrics",
                 str(out / "m.json"), *extra]) == 0  # fmt: skip
    assert main(["score-passages", "--config", str(score), "--model", str(model), "--questions",
                 str(questions), "--output", str(out / "scored"), *extra]) == 0  # fmt: skip
    assert main(["eval-retrieval", "--questions", str(questions), "--output",
                 str(out / "top.json")]) == 0  # fmt: skip
    outputs = {name: (out / name).read_text() for name in ("p.jsonl", "top.json")}
    metrics = json.loads((out / "m.json").read_text())
    del metrics["generation"]  # speed: measured, not a result
    return {**outputs, "m.json": metrics}


def test_a_run_on_compact_lists_equals_the_run_on_fid_json(
    tmp_path, toy_records, toy_corpus, tiny_model_dir
):
    tsv, store = toy_corpus
    records = [dict(r, ctxs=[dict(c, has_answer=False) for c in r["ctxs"]]) for r in toy_records["dev"][:5]]  # fmt: skip
    fid_json = write_json(tmp_path / "dev.json", records)
    compact = _compact(tmp_path, records, store, "dev")
    on_json = _fid_run(tmp_path, "json", fid_json, tiny_model_dir)
    on_compact = _fid_run(tmp_path, "compact", compact, tiny_model_dir, store)
    assert on_compact == on_json
    # scored compact lists, exported, are the scored FiD json
    convert_lists(tmp_path / "compact" / "scored", store, tmp_path / "scored.json")
    scored_json = json.loads((tmp_path / "json" / "scored").read_text())
    assert json.loads((tmp_path / "scored.json").read_text()) == scored_json
    assert sum(c["reader_score"] is not None for c in scored_json[0]["ctxs"]) == 3


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-16])


@pytest.mark.parametrize(
    "damage, message",
    [
        ("unknown id", "names passage id 'nowhere', which the passage store"),
        ("other corpus", "was retrieved from a corpus with sha256"),
        ("truncated ids", "ids.npy: "),
        ("truncated offsets", "offsets.npy: "),
        ("tsv changed", "is not the file the passage store"),
        ("tsv edited inside", "do not hold passage"),
        ("no store", "not a passage store"),
        ("no passages given", "Hint: pass --passages"),
    ],
)
def test_bad_lists_and_stores_are_one_clear_error(
    damage, message, tmp_path, toy_records, toy_world
):
    # filler passages put p1 and p2 beyond the first and last MiB that open_store samples
    filler = [type("P", (), dict(id=f"f{i}", title="t", text="x" * 500)) for i in range(5000)]
    tsv = _write_tsv(tmp_path / "psgs.tsv", [*filler[:2500], *toy_world.passages, *filler[2500:]])
    store = tmp_path / "store"
    build_passage_store(tsv, store)
    records = toy_records["dev"][:3]
    compact = _compact(tmp_path, records, store, "dev")
    passages = store
    if damage == "unknown id":
        lines = compact.read_text().splitlines()
        line = json.loads(lines[2])
        line["passages"][1] = "nowhere"
        compact.write_text("\n".join([*lines[:2], json.dumps(line), *lines[3:]]) + "\n")
    elif damage == "other corpus":
        other = _write_tsv(tmp_path / "other.tsv", toy_world.passages[:-1])
        build_passage_store(other, tmp_path / "other")
        passages = tmp_path / "other"
    elif damage == "truncated ids":
        _truncate(store / "ids.npy")
    elif damage == "truncated offsets":
        _truncate(store / "offsets.npy")
    elif damage == "tsv changed":
        tsv.write_text(tsv.read_text().replace("\tp0\t", "\tp0\t") + "p999\tnew\tnew\n")
    elif damage == "tsv edited inside":  # same size, same first and last MiB: two ids swapped
        a, b = (f"\n{c['id']}\t" for c in records[0]["ctxs"][:2])
        tsv.write_text(tsv.read_text().replace(a, "\nswap\t").replace(b, a).replace("\nswap\t", b))
    elif damage == "no store":
        passages = tmp_path
    with pytest.raises(DataError, match=message):
        examples = load_examples(compact, passages=None if damage == "no passages given" else
                                 open_passages(passages))  # fmt: skip
        [e.ctxs for e in examples]  # noqa: B018 (reading every passage)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "a", "question": "q?", "passages": []}', "line 2: field 'passages' must be"),
        ('{"id": "a", "question": "q?", "passages": ["p1"], "columns": {"score": [1, 2]}}',
         "line 2: columns.score must be a list of 1"),
        ('{"id": "a", "question": "", "passages": ["p1"]}', "field 'question' must be"),
        ("{not json", "line 2: invalid JSON"),
    ],
)  # fmt: skip
def test_malformed_compact_lines_name_the_line(line, message, tmp_path, toy_corpus):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"format": "fid-retrieval-lists", "version": 1, "corpus": null}\n' + line)
    with pytest.raises(DataError, match=message):
        load_examples(path, passages=open_store(toy_corpus[1]))


def test_a_column_of_mixed_kinds_keeps_its_values(tmp_path):
    ctxs = [{"id": "1", "s": True}, {"id": "2", "s": 0.5}, {"id": "3", "s": "x"}, {"id": "4"}]
    lists = lists_from_records([{"id": "a", "question": "q?", "ctxs": ctxs}])
    write_lists(tmp_path / "l.jsonl", lists)
    assert read_lists(tmp_path / "l.jsonl").ctx_fields(0) == [
        {"id": "1", "s": True}, {"id": "2", "s": 0.5}, {"id": "3", "s": "x"}, {"id": "4", "s": None}
    ]  # fmt: skip


def test_duplicate_ids_in_a_store_name_the_id(tmp_path, toy_world):
    tsv = _write_tsv(tmp_path / "psgs.tsv", [*toy_world.passages, toy_world.passages[3]])
    with pytest.raises(DataError, match="duplicate passage id 'p3'"):
        build_passage_store(tsv, tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_store_arrays_are_memory_mapped(toy_corpus):
    store = open_store(toy_corpus[1])
    assert isinstance(store._ids, np.memmap) and isinstance(store._offsets, np.memmap)


def test_first_hit_ranks_behind_the_top_k_of_eval_retrieval(tmp_path, toy_records, toy_corpus):
    """Per-question ranks of the first answer-holding passage (the report's paired comparison
    of retrievers): by id, the same from FiD json, compact lists with their has_answer column and
    text recomputed through the store; their top-k is eval-retrieval's; unlabeled questions out."""
    from fid.config import EvalRetrievalConfig
    from fid.evaluation.retrieval import eval_retrieval, first_hit_ranks

    _, store = toy_corpus
    records = [dict(r) for r in toy_records["dev"][:6]]
    ranks_wanted = [0, 2, None, 1, None, None]
    for record, rank in zip(records, ranks_wanted, strict=True):
        record["ctxs"] = [dict(c, has_answer=i == rank) for i, c in enumerate(record["ctxs"])]
    records[5]["answers"] = []  # unlabeled: not scored
    fid_json = write_json(tmp_path / "dev.json", records)
    compact = _compact(tmp_path, records, store, "compact")
    cfg = EvalRetrievalConfig(ks=[1, 2, 3])
    wanted = {r["id"]: rank for r, rank in zip(records[:5], ranks_wanted, strict=False)}
    assert first_hit_ranks(cfg, fid_json) == wanted
    assert first_hit_ranks(cfg, compact, store) == wanted
    top = eval_retrieval(cfg, fid_json, tmp_path / "top.json")["accuracy"]
    for k in cfg.ks:
        share = sum(r is not None and r < k for r in wanted.values()) / len(wanted)
        assert top[str(k)] == pytest.approx(100 * share)
    # recomputed from the text (DPR's rule): what the passages really hold
    recomputed = EvalRetrievalConfig(recompute_has_answer=True)
    from_text = first_hit_ranks(recomputed, compact, store)
    assert from_text == first_hit_ranks(recomputed, fid_json)
    assert list(from_text) == list(wanted)
