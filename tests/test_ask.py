"""`fid ask` on a tiny run folder laid out as the workflow writes it (no snakemake): the run's
system (the last reader with the retriever whose lists it was scored on), answers, the passages
read, JSON lines, stdin, over-long questions, and one clear line for each bad input (paths,
bytes that are not UTF-8). That ask answers as the report scored: tests/workflow/test_rebuild.py
(test_ask_answers_as_the_report_scored)."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest
from tiny_run import N_PASSAGES, other_weights, write_tiny_run

from fid.cli import main
from fid.data.passages import load_passages
from fid.evaluation.run_system import lists_source, run_system


def _ask(*args) -> int:
    return main(["ask", *map(str, args)])


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir, toy_world) -> Path:
    """results/demo of a finished 2-round run (tests/tiny_run.py says what it holds)."""
    return write_tiny_run(tmp_path_factory.mktemp("workflow"), tiny_model_dir, toy_world)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def passages(run):
    return load_passages(run / "data/demo/world/passages.tsv")


def test_a_question_on_the_command_line(run, passages, toy_world, capsys, caplog):
    question = toy_world.splits["dev"][0].question
    assert _ask("--run", run, *question.split()) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"question: {question}" and lines[1].startswith("answer: ")
    assert lines[2] == f"passages read ({N_PASSAGES}):"
    shown = [re.fullmatch(r"  (\d)\. \[(\S+)\] (.+) \(score (-?[\d.]+)\): (.+)", line)
             for line in lines[3 : 3 + N_PASSAGES]]  # fmt: skip
    assert all(shown), lines
    assert [int(m[1]) for m in shown] == [1, 2, 3]
    assert all(passages[m[2]].title == m[3] for m in shown)
    seconds = [float(s) for s in re.findall(r"answered in ([\d.]+) s", caplog.text)]
    assert len(seconds) == 1 and seconds[0] < 5.0, seconds


def test_questions_from_stdin_and_json(run, passages, toy_world, monkeypatch, capsys):
    questions = [q.question for q in toy_world.splits["dev"][:2]]
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{questions[0]}\n\n  \n{questions[1]}\n"))
    assert _ask("--run", run, "--json") == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["question"] for r in records] == questions
    for record in records:
        assert isinstance(record["answer"], str)
        read = record["passages"]
        assert [p["rank"] for p in read] == list(range(1, N_PASSAGES + 1))
        assert [p["score"] for p in read] == sorted((p["score"] for p in read), reverse=True)
        assert all(passages[p["id"]].title == p["title"] for p in read)
        assert all(passages[p["id"]].text == p["text"] for p in read)


def test_explicit_paths_and_passage_count(run, toy_world, capsys):
    """Without --run: every path named, and no config file: the reader reads as many passages
    as it was trained on (fid_reader.json), or --n-passages."""
    named = {"reader": "iter1/reader/model", "retriever": "iter0/retriever/model",
             "index": "iter0/index", "passages": "data/demo/world/passages.tsv"}  # fmt: skip
    paths = [arg for flag, path in named.items() for arg in (f"--{flag}", run / path)]
    question = toy_world.splits["dev"][0].question
    for flags, expected in (([], 5), (["--n-passages", 2], 2)):
        assert _ask(*paths, *flags, "--json", question) == 0
        (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(record["passages"]) == expected


@pytest.mark.parametrize("where", ["store", "report_config"])
def test_passages_found_from_the_run(run, passages, tmp_path, toy_world, where, caplog, capsys):
    """A compact run's passage store, or the TSV that the run's config names (data.passages,
    relative to the folder that holds results/) when the run holds none."""
    copy = Path(shutil.copytree(run, tmp_path / "results" / "demo"))
    tsv = copy / "data/demo/world/passages.tsv"
    if where == "store":
        expected = copy / "passages/store"
        assert main(["build-passage-store", "--passages", str(tsv), "--output", str(expected)]) == 0
    else:
        expected = tmp_path / "corpus/passages.tsv"
        expected.parent.mkdir()
        tsv.rename(expected)
        (copy / "report").mkdir()
        (copy / "report/config.yaml").write_text("data:\n  passages: corpus/passages.tsv\n")
    assert _ask("--run", copy, "--json", toy_world.splits["dev"][0].question) == 0
    assert f"passages {expected}" in caplog.text
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(passages[p["id"]].text == p["text"] for p in record["passages"])


def _broken(run: Path, tmp: Path, case: str) -> tuple[list, str]:
    """(fid ask arguments, a text the error must hold) of a bad input."""
    copy = tmp / "results" / case
    if case == "no_such_run":
        return ["--run", copy], f"{copy}: run folder not found"
    if case == "no_trained_round":
        (copy / "data").mkdir(parents=True)
        return ["--run", copy], f"{copy}: no trained round"
    shutil.copytree(run, copy)
    if case == "index_missing":
        shutil.rmtree(copy / "iter0/index")
        return ["--run", copy], f"{copy / 'iter0/index'}: index folder not found"
    if case == "index_incomplete":
        (copy / "iter0/index/ids.npy").unlink()
        return ["--run", copy], f"{copy / 'iter0/index'}: index folder is missing ids.npy"
    if case == "round_not_trained":
        return ["--run", copy, "--round", 3], f"{copy / 'iter3/reader/model'}: round 3"
    if case == "round_0_reads_bm25":  # no dense retriever made round 0's lists
        (copy / "report").mkdir()
        (copy / "report/config.yaml").write_text("first_retrieval: bm25\n")
        return ["--run", copy, "--round", 0], (
            f"{copy / 'iter0/reader/model'}: round 0's reader was scored on the lists of bm25, "
            "which fid ask cannot search"
        )
    if case == "another_encoder":  # the same shape, other weights: same width, other scores
        retriever = copy / "iter0/retriever/model"
        other_weights(retriever)
        return ["--run", copy], "the questions would be encoded by"
    if case == "another_corpus":  # the same ids, other texts
        tsv = copy / "data/demo/world/passages.tsv"
        tsv.write_text(tsv.read_text().replace(" the ", " a "))
        return ["--run", copy], f"the passages given, {tsv}, are another file"
    assert case == "passages_missing"
    (copy / "data/demo/world/passages.tsv").unlink()
    return ["--run", copy], f"{copy}: no passages found"


@pytest.mark.parametrize(
    "case",
    ["no_such_run", "no_trained_round", "index_missing", "index_incomplete", "round_not_trained",
     "round_0_reads_bm25", "passages_missing", "another_encoder", "another_corpus"],
)  # fmt: skip
def test_bad_input_is_one_line_naming_the_path(run, tmp_path, case, caplog, capsys):
    args, message = _broken(run, tmp_path, case)
    assert _ask(*args, "who is it?") == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and message in errors[0], (message, errors)
    assert not any(r.exc_info for r in caplog.records), "an input error shows no traceback"
    assert capsys.readouterr().out == ""


def test_no_question_is_an_error(run, monkeypatch, caplog):
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n\n"))
    assert _ask("--run", run) == 1
    assert "no question" in caplog.text


@pytest.mark.parametrize("case", ["another_encoder", "another_corpus"])
def test_retrieve_refuses_another_encoder_or_corpus(run, tmp_path, case, caplog):
    """`fid retrieve` checks the index as `fid ask` does: its encoder and corpus."""
    _, message = _broken(run, tmp_path, case)
    copy = tmp_path / "results" / case
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "who is it?", "answers": ["x"]}\n')
    argv = ["retrieve", "--model", copy / "iter0/retriever/model", "--index", copy / "iter0/index",
            "--passages", copy / "data/demo/world/passages.tsv", "--questions", questions,
            "--output", tmp_path / "out.json"]  # fmt: skip
    assert main([str(a) for a in argv]) == 1
    assert message in caplog.text and str(copy / "iter0/index") in caplog.text
    assert not (tmp_path / "out.json").exists()


def test_an_index_without_its_sources_is_used_with_a_warning(run, tmp_path, toy_world, caplog):
    """An index built before fid recorded its encoder and corpus still answers, and says that
    it could not be checked."""
    copy = Path(shutil.copytree(run, tmp_path / "results" / "demo"))
    meta_path = copy / "iter0/index/meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["encoder"]["weights_sha256"] and meta["corpus"]["sampled_sha256"]
    meta_path.write_text(json.dumps({k: v for k, v in meta.items()
                                     if k not in ("encoder", "corpus")}))  # fmt: skip
    assert _ask("--run", copy, toy_world.splits["dev"][0].question) == 0
    assert "records neither its encoder nor its corpus" in caplog.text


def test_a_byte_order_mark_on_stdin_is_no_question_word(run, toy_world, monkeypatch, capsys):
    question = toy_world.splits["dev"][0].question
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"\ufeff{question}\n"))
    assert _ask("--run", run, "--json") == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["question"] == question


def test_the_run_system_is_the_last_reader_with_the_retriever_it_read(run, toy_world, caplog):
    """--run answers with round 1's reader and round 0's retriever and index (the lists it was
    scored on), not round 1's retriever (a decoy here: its index refuses it); --round 0 with a
    retriever and index given answers too, with a warning that the report did not score it."""
    question = toy_world.splits["dev"][0].question
    assert _ask("--run", run, question) == 0
    assert (f"reader {run / 'iter1/reader/model'}, retriever {run / 'iter0/retriever/model'}, "
            f"index {run / 'iter0/index'}") in caplog.text  # fmt: skip
    assert "the run's system (the report's headline scores it): round 1's reader" in caplog.text
    system = run_system(run)
    assert (system.round, system.source, system.index) == (1, "iter0", run / "iter0/index")
    assert system.lists("test") == run / "iter0/retrieval/test.json"
    assert system.metrics("test") == run / "iter1/reader/eval/test.json"
    assert system.n_passages == N_PASSAGES
    caplog.clear()
    flags = ["--retriever", run / "iter0/retriever/model", "--index", run / "iter0/index"]
    assert _ask("--run", run, "--round", 0, *flags, question) == 0
    assert "--retriever, --index replace the run's system's" in caplog.text
    assert "not those the report scored" in caplog.text


def test_round_0_reads_the_first_retrieval():
    """The rule the workflow takes too (rules/common.smk round_source)."""
    assert [lists_source(i, "bm25") for i in range(3)] == ["bm25", "iter0", "iter1"]


def _errors(caplog) -> list[str]:
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert not any(r.exc_info for r in caplog.records), "an input error shows no traceback"
    assert "a bug in fid" not in caplog.text
    return errors


def test_a_word_that_is_not_utf8_is_one_error(run, caplog, capsys):
    """A byte that is not UTF-8 in an argument (Python keeps it as a surrogate escape)."""
    word = b"caf\xe9".decode("utf-8", "surrogateescape")
    assert _ask("--run", run, "who", "founded", word) == 1
    (error,) = _errors(caplog)
    assert error == (
        "fid ask: word 3 of the question (b'caf\\xe9'): not UTF-8 (byte 0xe9 at byte offset 3: "
        "unexpected end of data): expected a question in UTF-8"
    )
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("binary", [True, False], ids=["bytes", "text_stream"])
def test_a_stdin_line_that_is_not_utf8_ends_after_the_lines_before(
    run, toy_world, monkeypatch, capsys, caplog, binary
):
    """The lines before it are answered (valid JSON lines); then one error naming stdin's line
    and byte offset, exit 1."""
    first = toy_world.splits["dev"][0].question.encode()
    data = first + b"\n\nwho is \xff?\nnever asked\n"
    stream = (io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape")
              if binary else io.StringIO(data.decode("utf-8", "surrogateescape")))  # fmt: skip
    if not binary:
        assert not hasattr(stream, "buffer")
    monkeypatch.setattr(sys, "stdin", stream)
    assert _ask("--run", run, "--json") == 1
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["question"] == first.decode()
    (error,) = _errors(caplog)
    offset = len(first) + 2 + len("who is ")
    assert error == (
        f"stdin: line 3: not UTF-8 (byte 0xff at byte offset {offset}: invalid start byte): "
        "expected questions, one a line, in UTF-8"
    )


def test_a_question_over_its_budget_is_cut_once_with_a_warning(run, toy_world, capsys, caplog):
    """A question longer than half of the reader's passage input (48 tokens here) keeps its
    first 24 tokens, said once; the answer's record keeps the question as asked."""
    question = toy_world.splits["dev"][0].question
    long = " ".join([question] * (10_000 // len(question) + 1))
    assert len(long) > 10_000
    assert _ask("--run", run, "--json", long) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["question"] == long and len(record["passages"]) == N_PASSAGES
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    cut = [w for w in warnings if "over its budget" in w]
    assert len(cut) == 1, warnings
    found = re.search(r"(\d+) reader tokens, over its budget of (\d+) .*kept the first (\d+) tok",
                      cut[0])  # fmt: skip
    assert found and int(found[1]) > 1000 and found[2] == found[3] == str(48 // 2), cut[0]
    caplog.clear()
    assert _ask("--run", run, question) == 0
    assert "over its budget" not in caplog.text


def test_ask_answers_as_eval_reader_scored_the_system(run, tmp_path, monkeypatch, capsys):
    """What the workflow's rules retrieve and eval_reader do for the run's system (round 0's
    retriever and index, the run's retrieve.yaml and eval_reader.yaml, round 1's reader), ask
    answers alike: the same passages read and the same answers, question by question."""
    system = run_system(run)
    lists, predictions = tmp_path / "lists.json", tmp_path / "predictions.jsonl"
    questions = run / "data/demo/world/dev.jsonl"
    assert main([str(a) for a in (
        "retrieve", "--config", run / "config/retrieve.yaml", "--model", system.retriever,
        "--index", system.index, "--passages", run / "data/demo/world/passages.tsv",
        "--questions", questions, "--output", lists,
    )]) == 0  # fmt: skip
    assert main([str(a) for a in (
        "eval-reader", "--config", run / "config/eval_reader.yaml", "--model", system.reader,
        "--questions", lists, "--predictions", predictions, "--metrics", tmp_path / "m.json",
    )]) == 0  # fmt: skip
    predicted = [json.loads(line) for line in predictions.read_text().splitlines()]
    read = {
        r["id"]: [c["id"] for c in r["ctxs"][:N_PASSAGES]] for r in json.loads(lists.read_text())
    }
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(p["question"] + "\n" for p in predicted)))
    assert _ask("--run", run, "--json") == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [[c["id"] for c in a["passages"]] for a in answers] == [read[p["id"]] for p in predicted]
    assert [a["answer"] for a in answers] == [p["prediction"] for p in predicted]
    assert any(p["prediction"] for p in predicted), "a reader that answers nothing proves little"


@pytest.mark.parametrize("case", ["no_such_run", "bad_word"])
def test_bad_input_is_said_before_torch_is_imported(tmp_path, case):
    """A run folder that is not there, or a word that is not UTF-8, is said before the
    seconds of importing torch and transformers (a process of its own: this one has them)."""
    word = "'caf\\udce9'" if case == "bad_word" else "'who?'"
    code = (
        "import sys; from fid.cli import main; "
        f"status = main(['ask', '--run', {str(tmp_path / 'results/none')!r}, {word}]); "
        "print(status, 'torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=False)  # fmt: skip
    assert result.stdout.split() == ["1", "False"], result.stdout + result.stderr
    expected = "not UTF-8 (byte 0xe9" if case == "bad_word" else "run folder not found"
    assert expected in result.stderr and "Traceback" not in result.stderr
