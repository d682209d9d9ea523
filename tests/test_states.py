"""`--state-root`: fid finds a training run's state by what the run is (fid.training.states):
the same run resumes its unfinished state, another run gets a new one, a finished state is set
aside for a new run (`snakemake --forcerun`), and no state is ever deleted."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from conftest import write_json
from safetensors.torch import load_file

from fid.cli import main
from fid.config import InitRetrieverConfig, ReaderTrainConfig
from fid.demo.tiny_models import build_tiny_bert, train_bert_tokenizer
from fid.runtime.fileio import atomic_directory
from fid.training import reader as reader_training
from fid.training import runs
from fid.training.states import (
    FINISHED,
    FINISHED_RUNS,
    RUN_RECORD,
    STATE_RECORD,
    state_key,
    state_record,
)

KNOBS = dict(
    n_passages=2, passage_max_tokens=16, batch_size_per_device=2, max_steps=2, warmup_steps=0,
    eval_every_steps=0, save_every_steps=1, log_every_steps=1, eval_batch_size=2,
    max_new_tokens=3, tensorboard=False,
)  # fmt: skip


@pytest.fixture
def run(tmp_path, tiny_model_dir, toy_records):
    train = write_json(tmp_path / "train.json", toy_records["train"][:4])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:2])

    def train_reader(knobs=None, train_file=train, output="model") -> int:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({**KNOBS, **(knobs or {})}))
        return main(["train-reader", "--config", str(config), "--train", str(train_file),
                     "--dev", str(dev), "--init-model", str(tiny_model_dir),
                     "--output", str(tmp_path / output), "--state-root",
                     str(tmp_path / "root")])  # fmt: skip

    return train_reader


def _states(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "root").iterdir())


def _record(path) -> dict:
    return json.loads(path.read_text())


def _run_id(model) -> str:
    """The id of the run that exported `model`."""
    return yaml.safe_load((model / "train_config.yaml").read_text())["run_id"]


def _train_steps(metrics) -> list[int]:
    return [r["step"] for r in map(json.loads, metrics.read_text().splitlines())
            if r["kind"] == "train"]  # fmt: skip


def _killed(train_reader, monkeypatch, **kwargs) -> None:
    """`train_reader` killed inside its second step, after the checkpoint of its first."""
    original, calls = reader_training.ReaderTask.loss, {"n": 0}

    def crashing_loss(self, model, item):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("simulated kill")
        return original(self, model, item)

    with monkeypatch.context() as patch:
        patch.setattr(reader_training.ReaderTask, "loss", crashing_loss)
        with pytest.raises(KeyboardInterrupt):
            train_reader(**kwargs)


def test_the_same_run_resumes_its_state(tmp_path, run, caplog, monkeypatch):
    _killed(run, monkeypatch)
    (key,) = _states(tmp_path)
    state = tmp_path / "root" / key
    assert (state / "step-1").is_dir() and (state / "train.log").is_file()
    assert not (state / FINISHED).exists()
    record = json.loads((state / STATE_RECORD).read_text())
    assert record["key"] == key and record["kind"] == "reader"
    assert record["config"]["lr"] == 1e-4 and "log_every_steps" not in record["config"]
    run_id = _record(state / RUN_RECORD)["run_id"]
    caplog.clear()
    # a cadence is no other run: the same state, resumed by the same run
    assert run({"log_every_steps": 2}, output="model2") == 0
    assert _states(tmp_path) == [key] and "resumed from" in caplog.text
    assert f"run {run_id}: resuming {state} from step 1" in caplog.text
    assert _run_id(tmp_path / "model2") == run_id == _record(state / FINISHED)["run_id"]
    # nor is a copy of the data elsewhere: content, not paths, identifies it
    (state / FINISHED).unlink()  # (a run killed before it marked its state finished)
    moved = shutil.copy(tmp_path / "train.json", tmp_path / "moved.json")
    assert run(train_file=moved, output="model3") == 0 and _states(tmp_path) == [key]
    assert "resumed from" in caplog.text and _run_id(tmp_path / "model3") == run_id


def test_a_finished_run_started_again_trains_anew(tmp_path, run, caplog):
    """`snakemake --forcerun train_reader` (or its output deleted): the same command after the
    run exported its model. The finished state decides nothing: its files are set aside, kept,
    and a new run trains from the first step under a new id."""
    model = tmp_path / "model"
    assert run() == 0
    (key,) = _states(tmp_path)
    state = tmp_path / "root" / key
    first = _run_id(model)
    marker = _record(state / FINISHED)
    assert marker["run_id"] == first and marker["output"] == str(model.resolve())
    assert (marker["step"], marker["best_step"]) == (2, 2)
    weights = load_file(model / "model.safetensors")
    caplog.clear()

    assert run() == 0
    second = _run_id(model)
    kept = state / FINISHED_RUNS / first
    assert second != first and _states(tmp_path) == [key]
    warning = (f"the state {state} finished and was exported to {model.resolve()} by run {first}; "
               f"training again from the start as run {second} (its checkpoints are kept in "
               f"{kept})")  # fmt: skip
    assert any(r.levelname == "WARNING" and r.getMessage() == warning for r in caplog.records)
    assert "starting a new run" in caplog.text and "resumed from" not in caplog.text
    assert "step 1/2 loss" in caplog.text
    # the new run's metrics start at its first step; the model is trained again (same seed)
    assert _train_steps(model / "metrics.jsonl") == [1, 2]
    assert _train_steps(state / "metrics.jsonl") == [1, 2]
    again = load_file(model / "model.safetensors")
    assert all(torch.equal(weights[name], again[name]) for name in weights)
    # the first run's files, kept as they were; the folder's own files stay
    assert {"step-2", "latest", "best_dev", "metrics.jsonl", RUN_RECORD, FINISHED} <= {
        p.name for p in kept.iterdir()
    }
    assert (kept / "latest" / "model.safetensors").is_file()  # the relative link moved too
    assert _record(kept / RUN_RECORD)["run_id"] == first
    assert _record(kept / FINISHED) == marker and _train_steps(kept / "metrics.jsonl") == [1, 2]
    assert {STATE_RECORD, "run.lock", "train.log", RUN_RECORD, FINISHED} <= {
        p.name for p in state.iterdir()
    }
    assert _record(state / RUN_RECORD)["run_id"] == _record(state / FINISHED)["run_id"] == second
    log = (state / "train.log").read_text()  # the state's log tells both runs
    assert f"run {first}: new run in {state}" in log and warning in log

    # a third run sets the second aside beside the first, and names the first
    caplog.clear()
    assert run() == 0
    assert sorted(p.name for p in (state / FINISHED_RUNS).iterdir()) == sorted([first, second])
    assert f"by run {second}; training again" in caplog.text
    assert f"finished and kept in {state / FINISHED_RUNS} (delete them" in caplog.text
    assert caplog.text.split("(delete them when they are no longer needed): ")[1].startswith(
        f"{first}\n"
    )


def test_a_run_killed_while_it_exports_resumes_and_exports(tmp_path, run, caplog, monkeypatch):
    """Killed after its last checkpoint, in the middle of its export: the state is unfinished,
    so the run resumes it (no step trained again), exports, and marks it finished."""

    def killed_while_exporting(state_dir, output_dir, record):
        with atomic_directory(output_dir) as tmp:
            shutil.copytree(state_dir / "best_dev", tmp, dirs_exist_ok=True)
            raise KeyboardInterrupt("simulated kill")

    with monkeypatch.context() as patch:
        patch.setattr(runs, "export_best_model", killed_while_exporting)
        with pytest.raises(KeyboardInterrupt):
            run()
    (key,) = _states(tmp_path)
    state = tmp_path / "root" / key
    assert (state / "step-2").is_dir() and not (state / FINISHED).exists()
    assert not (tmp_path / "model").exists()
    run_id = _record(state / RUN_RECORD)["run_id"]
    metrics = (state / "metrics.jsonl").read_text()
    caplog.clear()

    assert run() == 0
    assert f"run {run_id}: resuming {state} from step 2" in caplog.text
    assert f"resumed from {state / 'step-2'} (step 2 of 2)" in caplog.text
    assert "loss" not in caplog.text and "finished and was exported" not in caplog.text
    assert (state / "metrics.jsonl").read_text() == metrics
    assert _run_id(tmp_path / "model") == run_id == _record(state / FINISHED)["run_id"]
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert not (state / FINISHED_RUNS).exists()


def test_another_run_gets_a_new_state_and_the_old_one_is_kept(tmp_path, run, caplog):
    assert run() == 0
    (first,) = _states(tmp_path)
    caplog.clear()
    assert run({"lr": 3e-4}) == 0
    states = _states(tmp_path)
    assert len(states) == 2 and first in states
    assert "starting a new run" in caplog.text and "resumed from" not in caplog.text
    assert f"other training states under {tmp_path / 'root'}, kept" in caplog.text
    assert f"{first} (created " in caplog.text and ", finished by run " in caplog.text
    other_data = write_json(
        tmp_path / "other.json", json.loads((tmp_path / "dev.json").read_text())
    )
    assert run(train_file=other_data) == 0 and len(_states(tmp_path)) == 3


def test_the_key_covers_refused_keys_only(tmp_path, tiny_model_dir):
    train = write_json(tmp_path / "t.json", [{"question": "q", "answers": ["a"],
                                             "ctxs": [{"title": "t", "text": "x"}]}])  # fmt: skip

    def key(**knobs):
        cfg = ReaderTrainConfig(**{**KNOBS, **knobs})
        return state_key(state_record("reader", cfg, {"train": train}, tiny_model_dir))

    assert key() == key(eval_every_steps=5, keep_last_checkpoints=4)  # cadences: same run
    assert key() != key(seed=1) != key(n_passages=3)
    assert key() != state_key(
        state_record("reader", ReaderTrainConfig(**KNOBS), {"train": train}, "t5-base")
    )


def test_state_dir_and_state_root_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train-reader", "--train", "t", "--dev", "d", "--init-model", "m", "--output",
              "o", "--state-dir", "s", "--state-root", "r"])  # fmt: skip
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_finished_retriever_run_started_again_trains_anew(tmp_path, toy_records, caplog):
    texts = [c["text"] for r in toy_records["train"] for c in r["ctxs"]]
    tokenizer = train_bert_tokenizer(texts, vocab_size=300)
    config = InitRetrieverConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    build_tiny_bert(config, vocab_size=len(tokenizer)).save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    train = write_json(tmp_path / "train.json", toy_records["train"][:4])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:2])
    knobs = tmp_path / "c.yaml"
    knobs.write_text(yaml.safe_dump(dict(
        n_passages=3, score_key="score", question_max_tokens=12, passage_max_tokens=16,
        batch_size_per_device=2, max_steps=2, warmup_steps=0, eval_every_steps=0,
        save_every_steps=0, log_every_steps=1, eval_k=[1],
        select_on="candidate_agreement@1", tensorboard=False,
    )))  # fmt: skip
    model = tmp_path / "retriever"
    argv = ["train-retriever", "--config", str(knobs), "--train", str(train), "--dev", str(dev),
            "--init-model", str(tmp_path / "bert"), "--output", str(model), "--state-root",
            str(tmp_path / "root")]  # fmt: skip
    assert main(argv) == 0
    first = _run_id(model)
    caplog.clear()
    assert main(argv) == 0
    (key,) = _states(tmp_path)
    second = _run_id(model)
    assert second != first and f"by run {first}; training again" in caplog.text
    assert "starting a new run" in caplog.text and "resumed from" not in caplog.text
    assert _train_steps(model / "metrics.jsonl") == [1, 2]
    assert (tmp_path / "root" / key / FINISHED_RUNS / first / "step-2").is_dir()
