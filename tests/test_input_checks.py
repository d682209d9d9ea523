"""What an adversarial user found (189 probes of every command), each now refused or right:
flags that are no booleans counted as hits, a damaged best_dev exported, duplicate YAML keys,
lists naming a passage twice, plan-memory's long searches, space warnings off by 300x, and the
inputs that ended in a traceback or a misleading line.

Each case runs the command in-process and checks one clear error (or warning) naming the file,
line or key; none leaves an output behind.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml
from conftest import write_json
from test_training_state import _killed_while_exporting, _run
from test_training_state import files as files  # noqa: F401 (the fixture)

from fid.cli import main
from fid.config import ConfigError, EvalRetrievalConfig, load_config
from fid.data.examples import load_examples
from fid.errors import DataError


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and r.name == "fid"]


def _one_error(caplog, *parts) -> str:
    errors = _errors(caplog)
    assert len(errors) == 1, errors
    for part in parts:
        assert str(part) in errors[0], (part, errors[0])
    assert not any(r.exc_info for r in caplog.records), "an input error shows no traceback"
    return errors[0]


# ---------------------------------------------------------------- has_answer: booleans only


def _lists_with_flags(tmp_path, flags) -> tuple:
    records = [{"id": "q1", "question": "where?", "answers": ["Paris"],
                "ctxs": [{"id": str(i), "title": "T", "text": "somewhere else",
                          "score": 1.0 - i / 10, "has_answer": flag}
                         for i, flag in enumerate(flags)]}]  # fmt: skip
    return records, write_json(tmp_path / "retrieved.json", records)


def test_has_answer_strings_are_refused_not_counted(tmp_path, caplog):
    """`"has_answer": "no"` was bool("no") = True: top-1 100% instead of 0%."""
    _, path = _lists_with_flags(tmp_path, ["no", "no", "no"])
    output = tmp_path / "metrics.json"
    assert main(["eval-retrieval", "--questions", str(path), "--output", str(output)]) == 1
    _one_error(caplog, path, "record 0", "ctxs[0].has_answer must be true or false", "'no'")
    assert not output.exists()


def test_compact_has_answer_strings_are_refused_naming_the_line(tmp_path, caplog):
    path = tmp_path / "lists.jsonl"
    path.write_text('{"format": "fid-retrieval-lists", "version": 1, "corpus": null}\n'
                    '{"id": "q1", "question": "where?", "answers": ["Paris"], '
                    '"passages": ["1", "2"], "columns": {"has_answer": ["no", false]}}\n')  # fmt: skip
    output = tmp_path / "metrics.json"
    assert main(["eval-retrieval", "--questions", str(path), "--output", str(output)]) == 1
    _one_error(caplog, f"{path}: line 2", "columns.has_answer must hold booleans", "'no'")
    assert not output.exists()


def test_boolean_and_null_flags_are_read_as_they_are(tmp_path):
    """false counts as a miss, null is recomputed from the text (DPR's rule)."""
    from fid.evaluation.retrieval import eval_retrieval

    _, path = _lists_with_flags(tmp_path, [False, None, True])
    metrics = eval_retrieval(EvalRetrievalConfig(ks=[1, 2, 3]), path, tmp_path / "m.json")
    assert metrics["accuracy"] == {"1": 0.0, "2": 0.0, "3": 100.0}


def test_the_retrievers_dev_flags_are_checked_too(tmp_path):
    """The retriever's best checkpoint is chosen on these flags: the same check applies."""
    _, path = _lists_with_flags(tmp_path, ["yes", True])
    with pytest.raises(DataError, match="has_answer must be true or false"):
        load_examples(path)


# ---------------------------------------------------------------- a damaged best_dev


def test_a_damaged_best_dev_is_not_exported(tmp_path, files, tiny_model_dir, monkeypatch,  # noqa: F811
                                            caplog):  # fmt: skip
    """Killed before its export, best_dev's weights then bit-flipped: the resumed run's export
    verifies best_dev against its manifest and refuses, leaving no model."""
    _killed_while_exporting(tmp_path, files, tiny_model_dir, monkeypatch)
    weights = tmp_path / "out" / "state" / "best_dev" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0x01
    weights.write_bytes(bytes(data))
    caplog.clear()
    assert _run(tmp_path, files, tiny_model_dir) == 1
    _one_error(caplog, "best_dev", "model.safetensors does not match its sha256",
               "was not exported")  # fmt: skip
    assert not (tmp_path / "out" / "model").exists()


# ---------------------------------------------------------------- YAML keys given twice


def test_a_key_given_twice_names_both_lines(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("ks: [1, 5]\nrecompute_has_answer: false\nks: [20]\n")
    with pytest.raises(ConfigError, match=r"key 'ks' is given twice \(line 1 and line 3\)"):
        load_config(path, EvalRetrievalConfig)
    nested = tmp_path / "nested.yaml"
    nested.write_text("a:\n  b: 1\n  c: 2\n  b: 3\n")
    from fid.config import check_unique_keys

    with pytest.raises(ConfigError, match=r"key 'b' is given twice \(line 2 and line 4\)"):
        check_unique_keys(nested)
    merged = tmp_path / "merged.yaml"  # `<<:` merges are YAML's own, and allowed
    merged.write_text("base: &b {x: 1}\nother:\n  <<: *b\n  x: 2\n")
    check_unique_keys(merged)


def test_a_passage_named_twice_in_a_list_is_warned_about(tmp_path, caplog):
    records = [{"id": "q7", "question": "where?", "answers": ["Paris"],
                "ctxs": [{"id": i, "title": "T", "text": "t"} for i in ("1", "2", "1", "1")]}]  # fmt: skip
    load_examples(write_json(tmp_path / "fid.json", records))
    assert "1 question(s) name a passage more than once" in caplog.text
    assert "question 'q7', passage '1'" in caplog.text
    caplog.clear()
    compact = tmp_path / "lists.jsonl"
    compact.write_text('{"format": "fid-retrieval-lists", "version": 1, "corpus": null}\n'
                       '{"id": "a", "question": "q?", "passages": ["1", "2"]}\n'
                       '{"id": "b", "question": "q?", "passages": ["3", "2", "3"]}\n')  # fmt: skip
    tsv = tmp_path / "p.tsv"
    tsv.write_text("id\ttext\ttitle\n1\tone\tA\n2\ttwo\tB\n3\tthree\tC\n")
    load_examples(compact, passages=tsv)
    assert "question 'b', passage '3'" in caplog.text


# ---------------------------------------------------------------- plan-memory in a few traces


def test_largest_that_fits_traces_a_few_sizes():
    """A peak flat up to 1,000 items (a fixed update peak above the batch's own), then linear:
    the answer (70,000 here) in a few plans, where stepping back one size at a time traced
    thousands."""
    from fid.memory.plan import largest_that_fits

    class Plan:
        def __init__(self, n):
            self.peak = max(10_000, 10 * n)

    asked = []

    def plan_at(n):
        asked.append(n)
        return Plan(n)

    n, plan = largest_that_fits(plan_at, 700_005)
    assert n == 70_000 and plan.peak <= 700_005
    assert len(asked) <= 12, asked
    asked.clear()
    assert largest_that_fits(plan_at, 9_999)[0] == 0 and asked == [1]
    asked.clear()
    steps = {n: 1_000 + 37 * n + (n % 5) for n in range(1, 5000)}  # roughly linear, ragged
    found, _ = largest_that_fits(lambda n: asked.append(n) or type("P", (), {"peak": steps[n]}),
                                 100_000)  # fmt: skip
    assert found == max(n for n, p in steps.items() if p <= 100_000
                        and all(steps[m] <= 100_000 for m in range(1, n)))  # fmt: skip
    assert len(asked) <= 20, asked


def test_plan_memory_that_fits_nothing_says_so_in_few_traces(tmp_path, monkeypatch, capsys):
    """t5-base at 0.000001 GiB: one trace says no, and the remedies add at most two (FSDP's
    ranks come in closed form from the one question's trace)."""
    from fid.memory import plan

    traced = []
    real = plan._run_trace
    monkeypatch.setattr(plan, "_TRACES", {})
    monkeypatch.setattr(plan, "_run_trace", lambda inputs: traced.append(inputs) or real(inputs))
    config = tmp_path / "reader.yaml"
    config.write_text("n_passages: 4\npassage_max_tokens: 16\n")
    model = tmp_path / "t5"
    model.mkdir()
    from transformers import T5Config

    T5Config(vocab_size=300, d_model=16, d_ff=32, d_kv=4, num_layers=2, num_heads=2,
             decoder_start_token_id=0).save_pretrained(model)  # fmt: skip
    assert main(["plan-memory", "--for", "train-reader", "--config", str(config), "--model",
                 str(model), "--gpu-memory", "0.000001GiB"]) == 1  # fmt: skip
    assert "not even one question fits" in capsys.readouterr().out
    assert len(traced) <= 3, [t.shape for t in traced]
    traced.clear()
    assert main(["plan-memory", "--for", "train-reader", "--config", str(config), "--model",
                 str(model), "--gpu-memory", "80GiB"]) == 0  # fmt: skip
    assert "largest that fits" in capsys.readouterr().out
    assert len(traced) <= 12, [t.shape.questions for t in traced]


# ---------------------------------------------------------------- sizes said right


def test_embedding_space_warning_counts_passages_not_bytes(tmp_path, tiny_retriever_dir,
                                                           monkeypatch, caplog):  # fmt: skip
    import fid.runtime.fileio

    tsv = tmp_path / "p.tsv"
    tsv.write_text("id\ttext\ttitle\n" + "".join(f"{i}\tpassage number {i} of the toy corpus\tT\n"
                                                for i in range(20)))  # fmt: skip
    monkeypatch.setattr(fid.runtime.fileio, "free_bytes", lambda folder: 1)
    assert main(["embed-passages", "--model", str(tiny_retriever_dir), "--passages", str(tsv),
                 "--output", str(tmp_path / "shard0")]) == 0  # fmt: skip
    assert "about 20 embeddings of d=" in caplog.text


def test_a_residual_budget_above_the_finest_coding_counts_what_it_uses():
    from fid.retrieval.residual_layout import code_bytes

    assert code_bytes(10**9, 256) == 256 + 2  # 8 bits a dimension and the float16 scale
    assert code_bytes(144, 256) == 144
    assert code_bytes("PQ32", 256) == 32


# ---------------------------------------------------------------- one clear line each


def test_thread_counts_are_checked(tmp_path, monkeypatch, caplog, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--threads", "0", "eval-baseline", "--train", "t", "--questions", "q",
              "--output", str(tmp_path / "o.json")])  # fmt: skip
    assert exit_.value.code == 2 and "'0': expected an integer >= 1" in capsys.readouterr().err
    monkeypatch.setenv("FID_THREADS", "abc")
    argv = ["embed-passages", "--model", str(tmp_path / "m"), "--passages", str(tmp_path / "p"),
            "--output", str(tmp_path / "s")]  # fmt: skip
    assert main(argv) == 1
    _one_error(caplog, "FID_THREADS = 'abc': expected an integer >= 1")


@pytest.mark.parametrize("case", ["truncated", "negative", "list", "t5_for_embedding"])
def test_plan_memory_on_a_bad_model_config(tmp_path, tiny_model_dir, case, caplog):
    folder = tmp_path / "model"
    folder.mkdir()
    command = "train-reader"
    config = json.loads((tiny_model_dir / "config.json").read_text())
    if case == "truncated":
        (folder / "config.json").write_text('{"model_type": "t5", "d_model": ')
        expected = ["config.json: not valid JSON"]
    elif case == "negative":
        (folder / "config.json").write_text(json.dumps({**config, "d_model": -5}))
        expected = ["config.json: d_model = -5: expected a positive integer"]
    elif case == "list":
        (folder / "config.json").write_text("[]")
        expected = ["config.json: expected a JSON object with a model_type", "found list"]
    else:
        folder = tiny_model_dir
        command = "embed-passages"
        expected = ["encoder-decoder, but this plans a retriever"]
    assert main(["plan-memory", "--for", command, "--model", str(folder)]) == 1
    _one_error(caplog, *expected)


def test_a_yaml_number_without_a_dot_is_explained(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("lr: 1e-4\n")
    from fid.config import ReaderTrainConfig

    with pytest.raises(ConfigError, match=r"YAML reads 1e-4 as text.*write 0\.0001 or 1\.0e-04"):
        load_config(path, ReaderTrainConfig)


@pytest.mark.parametrize("kind", ["folder", "fifo", "huge"])
def test_a_config_path_that_is_no_yaml_file(tmp_path, kind, caplog):
    path = tmp_path / "c.yaml"
    if kind == "folder":
        path.mkdir()
        expected = "is a folder: expected a YAML file"
    elif kind == "fifo":
        os.mkfifo(path)
        expected = "is not a regular file"
    else:
        path.write_text("ks: [" + ", ".join("1" for _ in range(600_000)) + "]\n")
        expected = "a file of knobs is a few KB"
    output = tmp_path / "m.json"
    assert main(["eval-retrieval", "--config", str(path), "--questions", str(tmp_path / "q"),
                 "--output", str(output)]) == 1  # fmt: skip
    error = _one_error(caplog, path, expected)
    assert len(error) < 400 and not output.exists()


def test_a_short_passage_row_is_named_when_the_store_is_built(tmp_path, caplog):
    tsv = tmp_path / "p.tsv"
    tsv.write_text("id\ttext\ttitle\n1\tthe first\tA\n2\tno title here\n")
    output = tmp_path / "store"
    assert main(["build-passage-store", "--passages", str(tsv), "--output", str(output)]) == 1
    _one_error(caplog, f"{tsv}: line 3", "expected 3 tab-separated columns", "found 2")
    assert not output.exists()


def _compact(tmp_path, line: str):
    tsv = tmp_path / "p.tsv"
    tsv.write_text("id\ttext\ttitle\n1\tone\tA\n2\ttwo\tB\n")
    path = tmp_path / "lists.jsonl"
    path.write_text('{"format": "fid-retrieval-lists", "version": 1, "corpus": null}\n'
                    + line + "\n")  # fmt: skip
    return path, tsv


@pytest.mark.parametrize("case", ["answers_string", "duplicate_ids", "score_text"])
def test_convert_lists_checks_what_other_commands_check(tmp_path, case, caplog):
    if case == "answers_string":
        line = '{"id": "a", "question": "q?", "answers": "Paris", "passages": ["1"]}'
        expected = "field 'answers' must be a list of strings"
    elif case == "duplicate_ids":
        line = ('{"id": "a", "question": "q?", "passages": ["1"]}\n'
                '{"id": "a", "question": "r?", "passages": ["2"]}')  # fmt: skip
        expected = "duplicate id 'a'"
    else:
        line = '{"id": "a", "question": "q?", "passages": ["1"], "columns": {"score": ["high"]}}'
        expected = "columns.score must hold numbers"
    path, tsv = _compact(tmp_path, line)
    output = tmp_path / "out.json"
    assert main(["convert-lists", "--input", str(path), "--passages", str(tsv),
                 "--output", str(output)]) == 1  # fmt: skip
    _one_error(caplog, path, expected)
    assert not output.exists()


def test_outputs_are_readable_as_the_umask_allows(tmp_path):
    """safetensors writes its files 0600; fid's folders give them what open() would."""
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("id\ttext\ttitle\n" + "".join(f"{i}\tword{i} text here now\tT{i}\n"
                                                   for i in range(30)))  # fmt: skip
    config = tmp_path / "init.yaml"
    config.write_text(yaml.safe_dump({"vocab_size": 200, "d_model": 8, "d_ff": 16, "d_kv": 4,
                                      "num_layers": 1, "num_decoder_layers": 1,
                                      "num_heads": 2}))  # fmt: skip
    old = os.umask(0o022)
    try:
        assert main(["init-reader", "--config", str(config), "--corpus", str(corpus),
                     "--output", str(tmp_path / "reader")]) == 0  # fmt: skip
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "reader" / "model.safetensors").stat().st_mode)
    assert mode == 0o644, oct(mode)
