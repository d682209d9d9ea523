"""Bad inputs through the `fid` command: one line naming the file, exit status 1, no output.

Each case builds one bad input (a model folder missing a file, a corrupt archive, a duplicate
id, ...) and runs `fid.cli.main` in-process; the error must name the file (or record, or key),
end with exit status 1 and leave nothing under the command's output names. A genuine bug keeps
its traceback and says it is one.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from conftest import write_json

from fid.cli import main

LATIN1 = "question: caf\xe9\n".encode("latin-1")  # not UTF-8


@dataclass
class Inputs:
    """What the cases build their bad inputs from."""

    tmp: Path
    model: Path  # a good tiny reader folder (copy it before breaking it)
    retriever: Path  # a good tiny DualEncoder folder, with a projection head
    questions: Path  # good FiD-format questions
    passages: Path  # a good passage TSV

    def reader_copy(self) -> Path:
        return Path(shutil.copytree(self.model, self.tmp / "reader"))

    def retriever_copy(self) -> Path:
        return Path(shutil.copytree(self.retriever, self.tmp / "retriever"))


@dataclass
class Case:
    argv: list[str]
    messages: list[str]  # each must appear in the error line
    outputs: list[Path]  # none may exist afterwards


def _eval_reader(i: Inputs, model: Path, questions: Path | None = None) -> Case:
    outputs = [i.tmp / "out" / "p.jsonl", i.tmp / "out" / "m.json"]
    argv = ["eval-reader", "--model", model, "--questions", questions or i.questions,
            "--predictions", outputs[0], "--metrics", outputs[1]]  # fmt: skip
    return Case(argv, [], outputs)


def _with(case: Case, *messages) -> Case:
    case.messages = [str(m) for m in messages]
    return case


def _config(reader: Path) -> dict:
    return json.loads((reader / "config.json").read_text())


# --- model folders -------------------------------------------------------------------------


def no_tokenizer_files(i):
    reader = i.reader_copy()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (reader / name).unlink()
    return _with(_eval_reader(i, reader), reader, "no tokenizer files")


def no_config_json(i):
    reader = i.reader_copy()
    (reader / "config.json").unlink()
    return _with(_eval_reader(i, reader), reader, "no config.json")


def config_json_not_json(i):
    reader = i.reader_copy()
    (reader / "config.json").write_text('{"model_type": "t5",')
    return _with(_eval_reader(i, reader), reader / "config.json", "not valid JSON")


def no_weights(i):
    reader = i.reader_copy()
    (reader / "model.safetensors").unlink()
    return _with(_eval_reader(i, reader), reader, "no model weights")


def truncated_safetensors(i):
    reader = i.reader_copy()
    weights = reader / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    return _with(_eval_reader(i, reader), weights, "truncated or corrupted")


def garbage_safetensors(i):
    reader = i.reader_copy()
    (reader / "model.safetensors").write_bytes(b"\x00" * 64)
    return _with(_eval_reader(i, reader), reader / "model.safetensors", "not a readable")


def tokenizer_larger_than_vocabulary(i):
    from transformers import AutoTokenizer

    reader = i.reader_copy()
    tokenizer = AutoTokenizer.from_pretrained(reader)
    tokenizer.add_tokens([f"extra{k}" for k in range(30)] + ["question:"])
    tokenizer.save_pretrained(reader)
    rows = _config(reader)["vocab_size"]
    return _with(_eval_reader(i, reader), reader, f"{len(tokenizer)} tokens", f"{rows} rows")


def config_vocab_differs_from_weights(i):
    reader = i.reader_copy()
    config = _config(reader)
    (reader / "config.json").write_text(json.dumps(dict(config, vocab_size=999)))
    return _with(_eval_reader(i, reader), reader / "config.json", "vocab_size 999")


def retriever_folder_as_reader(i):
    encoder = i.retriever / "question_encoder"
    return _with(_eval_reader(i, encoder), encoder / "config.json", "model_type 'bert'")


def missing_reader_folder(i):
    return _with(_eval_reader(i, i.tmp / "no-such-model"), i.tmp / "no-such-model", "not found")


def unknown_hub_name(i):
    case = _eval_reader(i, Path("fid-test-no-such-model-xyz"))
    return _with(case, "fid-test-no-such-model-xyz", "cannot load it as a hub name")


def score_passages_without_tokenizer(i):
    reader = i.reader_copy()
    (reader / "tokenizer.json").unlink()
    output = i.tmp / "out" / "scored.json"
    argv = ["score-passages", "--model", reader, "--questions", i.questions, "--output", output]
    return Case(argv, [str(reader), "no tokenizer files"], [output])


def train_reader_from_folder_without_config(i):
    reader = i.reader_copy()
    (reader / "config.json").unlink()
    argv = ["train-reader", "--train", i.questions, "--dev", i.questions, "--init-model", reader,
            "--output", i.tmp / "out" / "model", "--state-dir", i.tmp / "state"]  # fmt: skip
    return Case(argv, [str(reader), "no config.json"], [i.tmp / "out" / "model"])


def _retrieve(i: Inputs, model: Path) -> Case:
    output = i.tmp / "out" / "retrieved.json"
    argv = ["retrieve", "--model", model, "--index", i.tmp / "index", "--passages", i.passages,
            "--questions", i.questions, "--output", output]  # fmt: skip
    return Case(argv, [], [output])


def retriever_without_head(i):
    retriever = i.retriever_copy()
    (retriever / "head.safetensors").unlink()
    return _with(_retrieve(i, retriever), retriever, "no head.safetensors", "projection_dim")


def retriever_spec_with_unknown_key(i):
    retriever = i.retriever_copy()
    spec = json.loads((retriever / "dual_encoder.json").read_text())
    (retriever / "dual_encoder.json").write_text(json.dumps(dict(spec, poolng="mean")))
    return _with(_retrieve(i, retriever), retriever / "dual_encoder.json", "poolng")


def reader_folder_as_retriever(i):
    output = i.tmp / "out" / "model"
    argv = ["train-retriever", "--train", i.questions, "--dev", i.questions, "--init-model",
            i.model, "--output", output, "--state-dir", i.tmp / "state"]  # fmt: skip
    return Case(argv, [str(i.model / "config.json"), "an encoder-decoder (t5)"], [output])


def retriever_without_tokenizer(i):
    retriever = i.retriever_copy()
    (retriever / "question_encoder" / "tokenizer.json").unlink()
    output = i.tmp / "out" / "shard0"
    argv = ["embed-passages", "--model", retriever, "--passages", i.passages, "--output", output]
    return Case(argv, [str(retriever / "question_encoder"), "no tokenizer files"], [output])


# --- data and config -----------------------------------------------------------------------


def duplicate_question_ids_json(i):
    records = json.loads(i.questions.read_text())
    questions = write_json(i.tmp / "dup.json", [records[0], records[1], dict(records[1])])
    case = _eval_reader(i, i.model, questions)
    return _with(case, questions, "record 2", f"duplicate id {records[1]['id']!r}", "record 1")


def duplicate_question_ids_jsonl(i):
    records = json.loads(i.questions.read_text())
    questions = i.tmp / "dup.jsonl"
    questions.write_text(json.dumps(records[0]) + "\n" + json.dumps(records[0]) + "\n")
    case = _eval_reader(i, i.model, questions)
    return _with(case, questions, "(line 2)", "duplicate id", "(line 1)")


def duplicate_ids_in_raw_questions(i):
    raw = i.tmp / "raw.jsonl"
    raw.write_text('{"id": "q7", "question": "a?"}\n{"id": "q8", "question": "b?"}\n'
                   '{"id": "q7", "question": "c?"}\n')  # fmt: skip
    output = i.tmp / "out" / "q.jsonl"
    argv = ["prepare-questions", "--input", raw, "--output", output]
    return Case(argv, [f"{raw}: line 3", "duplicate id 'q7'", "first in line 1"], [output])


def fid_questions_not_utf8(i):
    questions = i.tmp / "latin1.json"
    questions.write_bytes(LATIN1)
    output = i.tmp / "out" / "metrics.json"
    argv = ["eval-retrieval", "--questions", questions, "--output", output]
    return Case(argv, [str(questions), "not UTF-8"], [output])


def config_not_utf8(i):
    config = i.tmp / "latin1.yaml"
    config.write_bytes(b"ks: [1]\n# caf\xe9\n")
    output = i.tmp / "out" / "metrics.json"
    argv = ["eval-retrieval", "--config", config, "--questions", i.questions, "--output", output]
    return Case(argv, [str(config), "not UTF-8"], [output])


def index_file_not_utf8(i):
    raw = i.tmp / "raw.jsonl"
    raw.write_text('{"question": "a?", "answer": ["x"]}\n')
    index = i.tmp / "idx.json"
    index.write_bytes(b"[0]\xff")
    output = i.tmp / "out" / "q.jsonl"
    argv = ["prepare-questions", "--input", raw, "--index", index, "--output", output]
    return Case(argv, [str(index), "not UTF-8"], [output])


def corpus_tsv_not_utf8(i):
    corpus = i.tmp / "corpus.tsv"
    corpus.write_bytes(b"id\ttext\ttitle\n1\tcaf\xe9 au lait\tT\n")
    output = i.tmp / "out" / "model"
    argv = ["init-reader", "--corpus", corpus, "--output", output]
    return Case(argv, [str(corpus), "not UTF-8"], [output])


def fp16_on_cpu(i):
    config = i.tmp / "eval.yaml"
    config.write_text("precision: fp16\n")
    case = _eval_reader(i, i.model)
    case.argv[1:1] = ["--config", config]
    return _with(case, config, "fp16", "CUDA")


def shard_out_of_range(i):
    output = i.tmp / "out" / "shard3"
    argv = ["embed-passages", "--model", i.retriever, "--passages", i.passages, "--shard", "3",
            "--n-shards", "2", "--output", output]  # fmt: skip
    return Case(argv, ["--shard", "[0, 2)", "got 3"], [output])


def reader_lists_bad_json_line(i):
    questions = i.tmp / "gold.jsonl"
    questions.write_text('{"id": "a", "gold_passage_id": "1"}\n{"id": "b", \n')
    output = i.tmp / "out" / "lists.json"
    argv = ["make-reader-lists", "--retrieved", i.questions, "--questions", questions,
            "--passages", i.passages, "--output", output]  # fmt: skip
    return Case(argv, [f"{questions}: line 2", "invalid JSON"], [output])


def answer_not_a_regex(i):
    questions = write_json(i.tmp / "regex.json", [
        {"id": "1", "question": "q", "answers": ["(unclosed"],
         "ctxs": [{"id": "p1", "title": "t", "text": "some text"}]}])  # fmt: skip
    config = i.tmp / "eval.yaml"
    config.write_text("has_answer_mode: regex\nrecompute_has_answer: true\nks: [1]\n")
    output = i.tmp / "out" / "accuracy.json"
    argv = ["eval-retrieval", "--config", config, "--questions", questions, "--output", output]
    return Case(argv, [str(questions), "invalid answer regex"], [output])


def bm25_index_meta_not_json(i):
    index = i.tmp / "bm25"
    index.mkdir()
    (index / "meta.json").write_text('{"format": ')
    output = i.tmp / "out" / "bm25.json"
    argv = ["retrieve-bm25", "--index", index, "--passages", i.passages, "--questions",
            i.questions, "--output", output]  # fmt: skip
    return Case(argv, [str(index / "meta.json"), "not valid JSON", "rebuild the index"], [output])


# --- archives and checkpoints ---------------------------------------------------------------


def truncated_gzip(i):
    archive = i.tmp / "psgs.tsv.gz"
    data = gzip.compress(b"id\ttext\ttitle\n" + b"1\tsome text here\tT\n" * 5000)
    archive.write_bytes(data[: len(data) // 2])
    output = i.tmp / "out" / "psgs.tsv"
    argv = ["extract", "--archive", archive, "--output", output]
    return Case(argv, [str(archive), "ends early or is corrupted"], [output])


def truncated_tar_gz(i):
    archive = i.tmp / "index.tar.gz"
    buffer = io.BytesIO()
    payload = torch.randint(0, 255, (100_000,), dtype=torch.uint8).numpy().tobytes()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("NQ.dev.idx.json")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    archive.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    output = i.tmp / "out" / "idx.json"
    argv = ["extract", "--archive", archive, "--member", "NQ.dev.idx.json", "--output", output]
    return Case(argv, [str(archive), "ends early or is corrupted"], [output])


def _released(i: Inputs, weights: bytes) -> Case:
    folder = i.tmp / "released"
    folder.mkdir()
    shutil.copy(i.model / "config.json", folder / "config.json")
    (folder / "pytorch_model.bin").write_bytes(weights)
    output = i.tmp / "out" / "hf"
    argv = ["convert-checkpoint", "--checkpoint", folder, "--output", output]
    return Case(argv, [str(folder / "pytorch_model.bin")], [output])


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def convert_with_unknown_tokenizer(i):
    case = _released(i, b"unread: the tokenizer is checked first")
    case.argv += ["--tokenizer", "fid-test-no-such-tokenizer"]
    return _with(case, "fid-test-no-such-tokenizer", "cannot load it as a hub name")


def convert_with_tokenizer_folder_without_files(i):
    case = _released(i, b"unread: the tokenizer is checked first")
    (i.tmp / "empty").mkdir()
    case.argv += ["--tokenizer", i.tmp / "empty"]
    return _with(case, i.tmp / "empty", "no tokenizer files")


def released_checkpoint_not_a_pickle(i):
    case = _released(i, b"<html>404 Not Found</html>")
    return _with(case, *case.messages, "UnpicklingError")


def released_checkpoint_truncated(i):
    data = _saved({"shared.weight": torch.zeros(64, 8)})
    case = _released(i, data[: len(data) // 2])
    return _with(case, *case.messages, "not a readable PyTorch checkpoint")


def released_checkpoint_not_a_state_dict(i):
    case = _released(i, _saved([1, 2, 3]))
    return _with(case, *case.messages, "expected a state dict", "found a list")


CASES = {
    f.__name__: f
    for f in [
        no_tokenizer_files,
        no_config_json,
        config_json_not_json,
        no_weights,
        truncated_safetensors,
        garbage_safetensors,
        tokenizer_larger_than_vocabulary,
        config_vocab_differs_from_weights,
        retriever_folder_as_reader,
        missing_reader_folder,
        unknown_hub_name,
        score_passages_without_tokenizer,
        train_reader_from_folder_without_config,
        retriever_without_head,
        retriever_spec_with_unknown_key,
        retriever_without_tokenizer,
        reader_folder_as_retriever,
        convert_with_unknown_tokenizer,
        convert_with_tokenizer_folder_without_files,
        duplicate_question_ids_json,
        duplicate_question_ids_jsonl,
        duplicate_ids_in_raw_questions,
        fid_questions_not_utf8,
        config_not_utf8,
        index_file_not_utf8,
        corpus_tsv_not_utf8,
        fp16_on_cpu,
        shard_out_of_range,
        reader_lists_bad_json_line,
        answer_not_a_regex,
        bm25_index_meta_not_json,
        truncated_gzip,
        truncated_tar_gz,
        released_checkpoint_not_a_pickle,
        released_checkpoint_truncated,
        released_checkpoint_not_a_state_dict,
    ]  # fmt: skip
}


@pytest.fixture
def inputs(tmp_path, tiny_model_dir, tiny_retriever_dir, toy_records, monkeypatch):
    # A hub name is looked up in the cache only (the variable is read when the hub is imported).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    passages = tmp_path / "psgs.tsv"
    passages.write_text("id\ttext\ttitle\n1\tthe first passage of the toy\tOne\n")
    return Inputs(
        tmp=tmp_path,
        model=tiny_model_dir,
        retriever=tiny_retriever_dir,
        questions=write_json(tmp_path / "dev.json", toy_records["dev"][:2]),
        passages=passages,
    )


def _error_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and r.name == "fid"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_naming_the_file(name, inputs, caplog):
    case = CASES[name](inputs)
    assert main([str(a) for a in case.argv]) == 1
    errors = _error_lines(caplog)
    assert len(errors) == 1, errors
    for message in case.messages:
        assert message in errors[0], (message, errors[0])
    assert not any(r.exc_info for r in caplog.records), "an input error shows no traceback"
    for output in case.outputs:
        assert not output.exists(), output


def test_failed_metrics_write_leaves_no_predictions(inputs, caplog):
    """eval-reader writes both outputs or neither (the metrics' folder is a file here)."""
    blocker = inputs.tmp / "out"
    blocker.write_text("a file where a folder should be")
    predictions = inputs.tmp / "p.jsonl"
    code = main(["eval-reader", "--model", str(inputs.model), "--questions",
                 str(inputs.questions), "--predictions", str(predictions),
                 "--metrics", str(blocker / "m.json")])  # fmt: skip
    assert code == 1 and str(blocker) in _error_lines(caplog)[0]
    assert not predictions.exists()
    assert not list(inputs.tmp.glob(".p.jsonl.*"))  # no temporary left either


def test_failed_record_write_leaves_no_download(inputs, caplog):
    """A record that cannot be written (its folder is a file) is said before any byte is
    fetched (the command checks where it writes first); nothing is left."""
    source = inputs.tmp / "source.bin"
    source.write_bytes(b"payload")
    blocker = inputs.tmp / "records"
    blocker.write_text("a file where a folder should be")
    output = inputs.tmp / "downloaded.bin"
    code = main(["download", "--url", source.as_uri(), "--output", str(output),
                 "--record", str(blocker / "r.json")])  # fmt: skip
    assert code == 1 and str(blocker) in _error_lines(caplog)[0]
    assert not output.exists() and not (inputs.tmp / "downloaded.bin.part").exists()


def test_full_disk_names_the_outputs(inputs, caplog, monkeypatch):
    """ENOSPC raised by a write carries no file name: the message names the outputs."""
    import fid.data.prepare

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fid.data.prepare, "atomic_write_jsonl", no_space)
    raw = inputs.tmp / "raw.jsonl"
    raw.write_text('{"question": "a?", "answer": ["x"]}\n')
    output = inputs.tmp / "q.jsonl"
    assert main(["prepare-questions", "--input", str(raw), "--output", str(output)]) == 1
    (error,) = _error_lines(caplog)
    assert "No space left on device" in error and str(output) in error and "Hint" in error


@pytest.mark.parametrize("exception", [ValueError("x must be > 0"), KeyError("ctxs"), OSError()])
def test_a_bug_keeps_its_traceback_and_says_so(exception, inputs, caplog, monkeypatch):
    """An error no input check explains is a bug in fid: traceback plus one line saying so."""
    import fid.data.prepare

    def broken(*args, **kwargs):
        raise exception

    monkeypatch.setattr(fid.data.prepare, "prepare_questions", broken)
    raw = inputs.tmp / "raw.jsonl"
    raw.write_text('{"question": "a?", "answer": ["x"]}\n')
    assert main(["prepare-questions", "--input", str(raw), "--output", str(inputs.tmp / "o")]) == 1
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert errors[0].exc_info is not None and errors[0].exc_info[1] is exception
    assert "bug in fid" in errors[-1].getMessage()


def test_out_of_gpu_memory_is_one_line_with_a_hint(inputs, caplog, monkeypatch):
    import fid.evaluation.reader

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(fid.evaluation.reader, "generate_answers", out_of_memory)
    case = _eval_reader(inputs, inputs.model)
    assert main([str(a) for a in case.argv]) == 1
    (error,) = _error_lines(caplog)
    assert "CUDA out of memory" in error and "Hint: lower the batch size" in error
    assert not any(r.exc_info for r in caplog.records)
    assert not any(output.exists() for output in case.outputs)
