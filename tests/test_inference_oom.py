"""A batch of an inference command that runs out of memory is redone in halves
(fid.runtime.oom_batch_halving).

Out-of-memory errors are simulated with FID_INJECT_OOM="K:TOKENS" (from the K-th forward on, a
batch of more than TOKENS real input tokens fails). Each command runs on tiny models twice, with
and without the injection, and must write the same outputs; a single question or passage that
cannot fit ends the run with one error naming it, exit status 1 and no output.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import yaml
from conftest import write_json

from fid.cli import main
from fid.data.examples import load_examples
from fid.data.reader_batches import ReaderCollator
from fid.runtime.oom_batch_halving import BatchSplitter, ItemDoesNotFit
from fid.runtime.oom_injection import INJECT_OOM, Injection

# Passages of up to 200 tokens: the 8 toy questions' reader inputs hold 284 to 353 tokens (their
# passages' lengths differ, so a piece of a batch may be padded shorter than the batch).
READER = dict(n_passages=3, passage_max_tokens=200, precision="fp32")
# A device that holds 700 tokens fits any two questions and no four: the second batch of 4 (the
# first fits: the injection starts at forward 2) is cut in two, and so are the later ones.
FITS_TWO = 700


def _run(*args) -> int:
    return main([str(a) for a in args])


def _config(path, **knobs):
    path.write_text(yaml.safe_dump(knobs))
    return path


def _warnings(caplog, command: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and r.getMessage().startswith(f"{command}: out of memory")]  # fmt: skip


def _error(caplog) -> str:
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, errors
    return errors[0]


@pytest.fixture
def questions(tmp_path, toy_records):
    return write_json(tmp_path / "dev.json", toy_records["dev"][:8])


def _longest_question(model_dir, questions_path) -> tuple[set[str], int]:
    """(ids of the questions with the most reader input tokens, that count)."""
    from transformers import AutoTokenizer

    examples = load_examples(questions_path)
    collator = ReaderCollator(AutoTokenizer.from_pretrained(model_dir), 3, 200)
    counts = collator.question_token_counts(examples)
    return {e.id for e, c in zip(examples, counts, strict=True) if c == max(counts)}, max(counts)


@pytest.mark.parametrize("mode", ["mean_logit", "pdist"])
def test_score_passages_split_scores_equal_the_unsplit(
    tmp_path, tiny_model_dir, questions, monkeypatch, caplog, mode
):
    config = _config(tmp_path / "score.yaml", **READER, batch_size=4, mode=mode)

    def score(name):
        out = tmp_path / f"{name}.json"
        assert _run("score-passages", "--config", config, "--model", tiny_model_dir,
                    "--questions", questions, "--output", out) == 0  # fmt: skip
        return json.loads(out.read_text())

    plain = score("plain")
    monkeypatch.setenv(INJECT_OOM, f"2:{FITS_TWO}")  # the first batch fits
    caplog.clear()
    split = score("split")
    assert _warnings(caplog, "score-passages"), caplog.text
    # the same passages scored (None: not read), the scores equal within float32 round-off:
    # a batch's size and padding change the order of the kernels' sums (measured here: 1e-7
    # relative for PDist's log-likelihoods, 3e-8 absolute for the cross-attention logits)
    assert [[c["reader_score"] is None for c in r["ctxs"]] for r in split] == [
        [c["reader_score"] is None for c in r["ctxs"]] for r in plain
    ]
    want = np.array([c["reader_score"] for r in plain for c in r["ctxs"]], dtype=float)
    got = np.array([c["reader_score"] for r in split for c in r["ctxs"]], dtype=float)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert [r["reader_scoring"] for r in split] == [r["reader_scoring"] for r in plain]


@pytest.mark.parametrize("knobs", [{}, {"keep_passages": 2}], ids=["plain", "accelerated"])
def test_eval_reader_split_answers_equal_the_unsplit(
    tmp_path, tiny_model_dir, questions, monkeypatch, caplog, knobs
):
    config = _config(tmp_path / "eval.yaml", **READER, eval_batch_size=4, max_new_tokens=4,
                     **knobs)  # fmt: skip

    def evaluate(name):
        predictions, metrics = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.json"
        assert _run("eval-reader", "--config", config, "--model", tiny_model_dir, "--questions",
                    questions, "--predictions", predictions, "--metrics", metrics) == 0  # fmt: skip
        return predictions.read_text()

    plain = evaluate("plain")
    monkeypatch.setenv(INJECT_OOM, f"2:{FITS_TWO}")
    caplog.clear()
    split = evaluate("split")
    warnings = _warnings(caplog, "eval-reader")
    assert len(warnings) == 1 and "from 4 to 2" in warnings[0], warnings
    assert split == plain


@pytest.mark.parametrize("command", ["score-passages", "eval-reader"])
def test_a_question_that_never_fits_is_named_and_nothing_is_written(
    tmp_path, tiny_model_dir, questions, monkeypatch, caplog, command
):
    config = _config(tmp_path / "c.yaml", **READER, batch_size=4) if command == "score-passages" \
        else _config(tmp_path / "c.yaml", **READER, eval_batch_size=4, max_new_tokens=2)  # fmt: skip
    outputs = {"score-passages": ["--output", tmp_path / "o.json"],
               "eval-reader": ["--predictions", tmp_path / "p.jsonl", "--metrics",
                               tmp_path / "m.json"]}[command]  # fmt: skip
    monkeypatch.setenv(INJECT_OOM, "1:10")
    assert _run(command, "--config", config, "--model", tiny_model_dir, "--questions",
                questions, *outputs) == 1  # fmt: skip
    error = _error(caplog)
    found = re.search(r"question '([^']+)' \((\d+) tokens\) alone ran out of memory", error)
    assert found, error
    longest, tokens = _longest_question(tiny_model_dir, questions)
    assert found[1] in longest and int(found[2]) == tokens, (error, longest, tokens)
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".json", ".jsonl")
                and p.name not in ("dev.json",)], list(tmp_path.iterdir())  # fmt: skip


# ---------------------------------------------------------------- retrieval


@pytest.fixture(scope="module")
def retriever_world(tmp_path_factory, toy_world, tiny_retriever_dir):
    """(a tiny DualEncoder folder, a passage TSV of the toy world, its questions)."""
    import shutil

    root = tmp_path_factory.mktemp("retriever")
    shutil.copytree(tiny_retriever_dir, root / "model")
    rows = ["id\ttext\ttitle"] + [f"{p.id}\t{p.text}\t{p.title}" for p in toy_world.passages]
    (root / "psgs.tsv").write_text("\n".join(rows) + "\n")
    questions = [{"id": q.id, "question": q.question, "answers": list(q.answers)}
                 for q in toy_world.splits["dev"]]  # fmt: skip
    write_json(root / "questions.json", questions)
    return root


def _embed(root, out, config) -> int:
    return _run("embed-passages", "--config", config, "--model", root / "model", "--passages",
                root / "psgs.tsv", "--output", out)  # fmt: skip


def test_embed_passages_split_vectors_equal_the_unsplit(
    tmp_path, retriever_world, monkeypatch, caplog
):
    config = _config(tmp_path / "embed.yaml", batch_size=8, precision="fp32")
    assert _embed(retriever_world, tmp_path / "plain", config) == 0
    monkeypatch.setenv(INJECT_OOM, "2:250")
    caplog.clear()
    assert _embed(retriever_world, tmp_path / "split", config) == 0
    assert _warnings(caplog, "embed-passages"), caplog.text
    assert np.array_equal(np.load(tmp_path / "plain.ids.npy"), np.load(tmp_path / "split.ids.npy"))
    # float16 vectors of float32 ones that a batch's padding changes by an ulp or so: equal
    # here; on another CPU one may round the other way
    np.testing.assert_array_max_ulp(np.load(tmp_path / "plain.npy"),
                                    np.load(tmp_path / "split.npy"), maxulp=1)  # fmt: skip


def test_retrieve_split_question_batches_retrieve_the_same(
    tmp_path, retriever_world, monkeypatch, caplog
):
    embed = _config(tmp_path / "embed.yaml", batch_size=8, precision="fp32")
    assert _embed(retriever_world, tmp_path / "shard0", embed) == 0
    assert _run("build-index", "--shards", tmp_path / "shard0", "--output", tmp_path / "index") == 0
    config = _config(tmp_path / "retrieve.yaml", batch_size=4, top_k=5, precision="fp32")

    def retrieve(name):
        out = tmp_path / f"{name}.json"
        assert _run("retrieve", "--config", config, "--model", retriever_world / "model",
                    "--index", tmp_path / "index", "--passages", retriever_world / "psgs.tsv",
                    "--questions", retriever_world / "questions.json", "--output", out) == 0  # fmt: skip
        return json.loads(out.read_text())

    plain = retrieve("plain")
    monkeypatch.setenv(INJECT_OOM, "2:45")
    caplog.clear()
    split = retrieve("split")
    assert _warnings(caplog, "retrieve"), caplog.text
    # the same passages (equal here, scores too); the scores within float32 round-off
    scores = (
        [[c.pop("score") for c in r["ctxs"]] for r in plain],
        [[c.pop("score") for c in r["ctxs"]] for r in split],
    )
    assert split == plain
    np.testing.assert_allclose(scores[1], scores[0], rtol=1e-6)


def test_a_passage_or_question_that_never_fits_is_named_and_nothing_is_written(
    tmp_path, retriever_world, monkeypatch, caplog
):
    config = _config(tmp_path / "embed.yaml", batch_size=8, precision="fp32")
    assert _embed(retriever_world, tmp_path / "index-shard", config) == 0
    assert _run("build-index", "--shards", tmp_path / "index-shard", "--output",
                tmp_path / "index") == 0  # fmt: skip
    monkeypatch.setenv(INJECT_OOM, "1:3")
    assert _embed(retriever_world, tmp_path / "shard0", config) == 1
    error = _error(caplog)
    assert re.search(r"embed-passages: passage '[^']+' \(\d+ tokens\) alone ran out", error), error
    assert not list(tmp_path.glob("shard0*"))

    caplog.clear()
    out = tmp_path / "retrieved.json"
    assert _run("retrieve", "--config", _config(tmp_path / "r.yaml", top_k=5, precision="fp32"),
                "--model", retriever_world / "model", "--index", tmp_path / "index",
                "--passages", retriever_world / "psgs.tsv", "--questions",
                retriever_world / "questions.json", "--output", out) == 1  # fmt: skip
    error = _error(caplog)
    assert re.search(r"retrieve: question 'dev-\d+' \(\d+ tokens\) alone ran out", error), error
    assert not out.exists()


# ---------------------------------------------------------------- the splitter itself


def _items(items):
    return {"items": list(items), "attention_mask": torch.ones(len(items))}  # a token each


def test_batches_are_halved_until_they_fit_and_the_size_stays_lowered(caplog):
    seen = []

    def forward(inputs):
        seen.append(inputs["items"])
        return [x * 10 for x in inputs["items"]]

    # from the 2nd forward on, more than 2 tokens (items) fail
    splitter = BatchSplitter("cmd", torch.device("cpu"), str, 5, Injection(2, 2))
    out = list(splitter.run([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11]], _items, forward))
    # 6..10 fails: the size goes 5 -> 3 (6 7 8 | 9 10); 6 7 8 fails: 3 -> 2 (6 7 | 8 | 9 10)
    assert [list(piece) for piece, _ in out] == [[1, 2, 3, 4, 5], [6, 7], [8], [9, 10], [11]]
    assert seen == [[1, 2, 3, 4, 5], [6, 7], [8], [9, 10], [11]]  # failed forwards return nothing
    assert [v for _, values in out for v in values] == [x * 10 for x in range(1, 12)]
    assert splitter.limit == 2 and splitter.forwards == 7
    warnings = _warnings(caplog, "cmd")
    assert len(warnings) == 2 and "from 5 to 3" in warnings[0] and "from 3 to 2" in warnings[1]

    one = BatchSplitter("cmd", torch.device("cpu"), lambda x: f"item {x}", 4, Injection(1, 0))
    with pytest.raises(ItemDoesNotFit, match=r"cmd: item 1 \(1 tokens\) alone ran out"):
        list(one.run([[1, 2, 3]], _items, forward))


def test_ranks_in_lockstep_do_not_split(monkeypatch):
    """A sharded model's ranks run every forward together: one rank may not redo one alone."""
    from fid.runtime import distributed

    monkeypatch.setattr(distributed, "in_lockstep", lambda: True)
    splitter = BatchSplitter("cmd", torch.device("cpu"), str, 4, Injection(1, 1))
    with pytest.raises(torch.OutOfMemoryError, match=INJECT_OOM):
        list(splitter.run([[1, 2]], _items, lambda inputs: inputs["items"]))
