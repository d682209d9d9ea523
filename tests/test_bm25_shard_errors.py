"""Bad input to a sharded BM25 (issue 48.5): a shard that failed or is missing, one of another
corpus (other statistics), of another shard count, or lists of other questions are refused by
name, exit status 1, and nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fid.cli import main

SQUAD = Path(__file__).resolve().parents[1] / "samples" / "squad-open-tiny"
PASSAGES = SQUAD / "psgs_w100.tsv"
QUESTIONS = SQUAD / "questions.jsonl"


def _run(*argv) -> int:
    return main([str(a) for a in argv])


def _shard(root: Path, passages: Path, stats: Path, k: int, n: int, questions=QUESTIONS) -> Path:
    """Shard k of n built and retrieved: its lists file."""
    root.mkdir(exist_ok=True)
    assert _run("build-bm25", "--passages", passages, "--shard", f"{k}/{n}", "--stats", stats,
                "--output", root / f"shard{k}of{n}") == 0  # fmt: skip
    lists = root / f"lists{k}of{n}.npz"
    assert _run("retrieve-bm25-shard", "--index", root / f"shard{k}of{n}", "--questions",
                questions, "--output", lists) == 0  # fmt: skip
    return lists


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """Statistics of squad-open-tiny and its 3 shards' lists; the same of a changed copy."""
    root = tmp_path_factory.mktemp("sharded")
    changed = root / "changed.tsv"
    lines = PASSAGES.read_text().splitlines(keepends=True)
    lines[5] = lines[5].replace("\t", "\tvolcano ", 1)  # one passage's text, a word more
    changed.write_text("".join(lines))
    assert _run("bm25-stats", "--passages", PASSAGES, "--output", root / "stats") == 0
    assert _run("bm25-stats", "--passages", changed, "--output", root / "stats-changed") == 0
    return {
        "root": root,
        "changed": changed,
        "lists": [_shard(root, PASSAGES, root / "stats", k, 3) for k in (1, 2, 3)],
        "changed_lists": [
            _shard(root / "of-changed", changed, root / "stats-changed", k, 3) for k in (1, 2, 3)
        ],  # fmt: skip
    }


def _refused(capsys, argv: list, output: Path, *names) -> str:
    """The command exits 1 with one message naming `names`, and writes nothing."""
    capsys.readouterr()
    assert _run(*argv) == 1, argv
    err = capsys.readouterr().err
    for name in names:
        assert str(name) in err, (name, err)
    assert not output.exists()
    return err


def _merge(built: dict, output: Path, lists: list, stats: str = "stats", questions=QUESTIONS):
    return ["merge-bm25-lists", "--stats", built["root"] / stats, "--shard-lists", *lists,
            "--passages", PASSAGES, "--questions", questions, "--output", output]  # fmt: skip


def test_the_lists_merge(built, tmp_path):
    assert _run(*_merge(built, tmp_path / "out.json", built["lists"])) == 0


def test_a_missing_shard_is_named(built, tmp_path, capsys):
    out = tmp_path / "out.json"
    _refused(capsys, _merge(built, out, built["lists"][:2]), out, "shard 3 of 3 is missing")
    _refused(capsys, _merge(built, out, built["lists"][1:]), out, "shard 1 of 3 is missing")


def test_a_failed_shard_is_named(built, tmp_path, capsys):
    """A shard whose job failed left no lists (atomic writes), or a file that is none."""
    out, absent, broken = tmp_path / "out.json", tmp_path / "lists2of3.npz", tmp_path / "bad.npz"
    _refused(capsys, _merge(built, out, [built["lists"][0], absent, built["lists"][2]]), out,
             absent, "shard lists not found")  # fmt: skip
    broken.write_bytes(built["lists"][1].read_bytes()[:200])  # cut short
    _refused(capsys, _merge(built, out, [built["lists"][0], broken, built["lists"][2]]), out,
             broken, "not shard lists")  # fmt: skip


def test_a_shard_of_a_changed_corpus_is_never_merged(built, tmp_path, capsys):
    out = tmp_path / "out.json"
    mixed = [built["lists"][0], built["changed_lists"][1], built["lists"][2]]
    _refused(capsys, _merge(built, out, mixed), out, "shard 2 of 3", built["changed_lists"][1],
             "other BM25 statistics")  # fmt: skip
    # every shard of the old corpus, merged against the new statistics
    _refused(capsys, _merge(built, out, built["lists"], stats="stats-changed"), out,
             "shard 1 of 3", "other BM25 statistics")  # fmt: skip


def test_a_shard_is_not_built_from_a_file_its_statistics_did_not_count(built, tmp_path, capsys):
    out = tmp_path / "shard"
    argv = ["build-bm25", "--passages", built["changed"], "--shard", "1/3", "--stats",
            built["root"] / "stats", "--output", out]  # fmt: skip
    _refused(capsys, argv, out, built["changed"], built["root"] / "stats", "bm25-stats")


def test_a_shard_of_another_shard_count_is_refused(built, tmp_path, capsys):
    out = tmp_path / "out.json"
    odd = _shard(tmp_path, PASSAGES, built["root"] / "stats", 2, 4)
    lists = [built["lists"][0], odd, built["lists"][2]]
    _refused(capsys, _merge(built, out, lists), out, odd, "shard 2 of 4", "of 4 shards")
    _refused(capsys, _merge(built, out, [*built["lists"], built["lists"][1]]), out,
             built["lists"][1], "shard 2 of 3 again")  # fmt: skip


def test_rows_that_do_not_follow_on_are_refused(built, tmp_path, capsys):
    """Lists whose rows do not continue the previous shard's (a hand-edited or foreign file)."""
    out, edited = tmp_path / "out.json", tmp_path / "edited.npz"
    with np.load(built["lists"][1]) as saved:
        arrays = dict(saved)
    meta = json.loads(str(arrays["meta"]))
    meta["shard"]["first_row"] += 1
    arrays["meta"] = np.array(json.dumps(meta))
    with open(edited, "wb") as handle:
        np.savez(handle, **arrays)
    lists = [built["lists"][0], edited, built["lists"][2]]
    _refused(capsys, _merge(built, out, lists), out, edited, "starts at passage row")


def test_lists_of_other_questions_or_top_k_are_refused(built, tmp_path, capsys):
    out = tmp_path / "out.json"
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("".join(QUESTIONS.read_text().splitlines(keepends=True)[:10]))
    _refused(capsys, _merge(built, out, built["lists"], questions=fewer), out,
             "shard 1 of 3", "lists of other questions")  # fmt: skip
    config = tmp_path / "top5.yaml"
    config.write_text("top_k: 5\n")
    _refused(capsys, [*_merge(built, out, built["lists"]), "--config", config], out,
             "shard 1 of 3", "top_k = 100")  # fmt: skip


def test_a_shard_index_is_no_whole_index_and_the_reverse(built, tmp_path, capsys):
    out = tmp_path / "out.json"
    argv = ["retrieve-bm25", "--index", built["root"] / "shard2of3", "--passages", PASSAGES,
            "--questions", QUESTIONS, "--output", out]  # fmt: skip
    _refused(capsys, argv, out, "shard 2 of 3", "retrieve-bm25-shard", "merge-bm25-lists")
    whole = tmp_path / "whole"
    assert _run("build-bm25", "--passages", PASSAGES, "--output", whole) == 0
    argv = ["retrieve-bm25-shard", "--index", whole, "--questions", QUESTIONS, "--output", out]
    _refused(capsys, argv, out, whole, "fid-bm25-shard/1")


def test_shard_flags(built, tmp_path, capsys):
    out = tmp_path / "shard"
    argv = ["build-bm25", "--passages", PASSAGES, "--shard", "1/3", "--output", out]
    _refused(capsys, argv, out, "--shard K/S and --stats STATS go together")
    for bad in ("4/3", "0/3", "1-3", "x/3"):
        with pytest.raises(SystemExit) as exit_:
            _run("build-bm25", "--passages", PASSAGES, "--shard", bad, "--stats",
                 built["root"] / "stats", "--output", out)  # fmt: skip
        assert exit_.value.code == 2
        assert "expected K/S" in capsys.readouterr().err
    assert not out.exists()


def test_a_config_of_another_analysis_is_refused(built, tmp_path, capsys):
    out, config = tmp_path / "shard", tmp_path / "snowball.yaml"
    config.write_text("stemmer: english\n")
    argv = ["build-bm25", "--config", config, "--passages", PASSAGES, "--shard", "1/3",
            "--stats", built["root"] / "stats", "--output", out]  # fmt: skip
    _refused(capsys, argv, out, "stemmer", built["root"] / "stats")


def test_too_many_shards_is_said(built, tmp_path, capsys):
    tiny = tmp_path / "tiny.tsv"
    tiny.write_text("".join(PASSAGES.read_text().splitlines(keepends=True)[:3]))  # 2 passages
    assert _run("bm25-stats", "--passages", tiny, "--output", tmp_path / "stats") == 0
    out = tmp_path / "shard"
    argv = ["build-bm25", "--passages", tiny, "--shard", "3/8", "--stats", tmp_path / "stats",
            "--output", out]  # fmt: skip
    _refused(capsys, argv, out, "shard 3 of 8 holds no passages", "fewer shards")


def test_duplicate_ids_across_shards_are_refused_by_the_statistics(tmp_path, capsys):
    """One index refuses a file with an id twice; the statistics do, though the two lines
    would fall in different shards."""
    lines = PASSAGES.read_text().splitlines(keepends=True)
    twice = tmp_path / "twice.tsv"
    twice.write_text("".join([*lines, lines[1]]))
    out = tmp_path / "stats"
    _refused(capsys, ["bm25-stats", "--passages", twice, "--output", out], out, twice,
             "duplicate id")  # fmt: skip
    shutil.rmtree(tmp_path / "stats", ignore_errors=True)


def test_statistics_without_their_tokens_are_refused(built, tmp_path, capsys):
    """A shard reads its passages' token ids from the statistics: a folder of the first format
    (no tokens) or with a cut token file is refused by name, not read as other tokens."""
    old = tmp_path / "stats-v1"
    shutil.copytree(built["root"] / "stats", old)
    meta = json.loads((old / "meta.json").read_text())
    (old / "meta.json").write_text(json.dumps({**meta, "format": "fid-bm25-stats/1"}))
    out = tmp_path / "shard"
    argv = ["build-bm25", "--passages", PASSAGES, "--shard", "1/3", "--stats", old, "--output", out]
    _refused(capsys, argv, out, old / "meta.json", "fid-bm25-stats/1", "fid-bm25-stats/2")
    cut = tmp_path / "stats-cut"
    shutil.copytree(built["root"] / "stats", cut)
    tokens = cut / "token_ids.i32"
    tokens.write_bytes(tokens.read_bytes()[:-4])
    argv = ["build-bm25", "--passages", PASSAGES, "--shard", "3/3", "--stats", cut, "--output", out]
    _refused(capsys, argv, out, tokens, "count the statistics again")
