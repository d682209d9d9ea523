"""The training loop: exact resume, checkpoints, best_dev, schedules and optimizer groups."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
import yaml
from conftest import write_json
from safetensors.torch import load_file

from fid.config import ReaderTrainConfig
from fid.training import reader as reader_training
from fid.training.optim import lr_factor, parameter_groups
from fid.training.reader import train_reader


def _config(**overrides):
    values = dict(
        n_passages=4,
        passage_max_tokens=32,
        batch_size_per_device=3,
        gradient_accumulation_steps=2,
        max_steps=8,
        lr=1e-3,
        warmup_steps=2,
        eval_every_steps=4,
        save_every_steps=4,
        log_every_steps=2,
        keep_last_checkpoints=5,
        eval_max_questions=4,
        eval_batch_size=4,
        max_new_tokens=4,
        dropout=0.1,  # dropout draws random numbers: their state must survive a resume
        precision="fp32",
        tensorboard=False,
    )
    values.update(overrides)
    return ReaderTrainConfig(**values)


@pytest.fixture
def data(tmp_path, toy_records):
    return (
        write_json(tmp_path / "train.json", toy_records["train"][:30]),
        write_json(tmp_path / "dev.json", toy_records["dev"]),
    )


def _train(cfg, data, model_dir, root):
    return train_reader(
        cfg, *data, str(model_dir), root / "model", root / "state", torch.device("cpu")
    )


def _weights(root):
    return load_file(root / "model" / "model.safetensors")


def _run_id(root):
    """The id of the run that exported root/model."""
    return yaml.safe_load((root / "model" / "train_config.yaml").read_text())["run_id"]


def test_resume_after_a_crash_is_bitwise_equal(tmp_path, data, tiny_model_dir, monkeypatch, caplog):
    cfg = _config(eval_every_steps=8)  # best_dev = the last step: compare final weights
    _train(cfg, data, tiny_model_dir, tmp_path / "straight")

    original_loss = reader_training.ReaderTask.loss
    calls = {"n": 0}

    def crashing_loss(self, model, item):
        calls["n"] += 1
        if calls["n"] == 2 * 5 + 1:  # inside step 6, after the checkpoint of step 4
            raise KeyboardInterrupt("simulated kill")
        return original_loss(self, model, item)

    monkeypatch.setattr(reader_training.ReaderTask, "loss", crashing_loss)
    with pytest.raises(KeyboardInterrupt):
        _train(cfg, data, tiny_model_dir, tmp_path / "resumed")
    state = tmp_path / "resumed" / "state"
    assert sorted(p.name for p in state.glob("step-*")) == ["step-4"]
    assert not (tmp_path / "resumed" / "model").exists()  # nothing half-written
    assert not (state / "finished.json").exists()
    run_id = json.loads((state / "run.json").read_text())["run_id"]
    monkeypatch.setattr(reader_training.ReaderTask, "loss", original_loss)
    with caplog.at_level(logging.INFO, logger="fid"):
        result = _train(cfg, data, tiny_model_dir, tmp_path / "resumed")
    # the same run goes on: its id kept, and said
    assert f"run {run_id}: resuming {state} from step 4" in caplog.text
    assert result["run_id"] == run_id != _run_id(tmp_path / "straight")
    assert _run_id(tmp_path / "resumed") == run_id

    straight, resumed = _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    # The metrics file holds each step once, as if the run had never stopped.
    records = [json.loads(line) for line in (state / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["kind"], r["step"]) for r in records]
    assert len(keys) == len(set(keys))
    assert [r["step"] for r in records if r["kind"] == "train"] == [2, 4, 6, 8]
    straight_losses = [
        json.loads(line)["loss"]
        for line in (tmp_path / "straight/state/metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    assert straight_losses == [r["loss"] for r in records if r["kind"] == "train"]


def test_checkpoint_layout_and_export(tmp_path, data, tiny_model_dir):
    cfg = _config(keep_last_checkpoints=1, max_tokens_per_batch=200)
    result = _train(cfg, data, tiny_model_dir, tmp_path)
    state = tmp_path / "state"
    assert sorted(p.name for p in state.glob("step-*")) == ["step-8"]  # keep the last 1
    assert os.readlink(state / "latest") == "step-8"  # relative, never best_dev
    assert (state / "best_dev" / "model.safetensors").is_file()
    saved = torch.load(state / "step-8" / "training_state.pt", weights_only=True)
    assert saved["progress"]["step"] == 8 and saved["config"]["max_steps"] == 8
    model = tmp_path / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "metrics.jsonl"):
        assert (model / name).is_file(), name
    assert result["best_step"] in (4, 8)
    dev = [
        json.loads(line)
        for line in (model / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "dev"
    ]
    assert [d["step"] for d in dev] == [4, 8] and all(d["n"] == 4 for d in dev)
    train = [json.loads(line) for line in (model / "metrics.jsonl").read_text().splitlines()]
    assert all(r["peak_memory_mb"] > 0 for r in train if r["kind"] == "train")
    # Its last act marks the state finished (a run started again then trains anew:
    # test_states.py), and its id is in the exported config.
    finished = json.loads((state / "finished.json").read_text())
    assert (finished["step"], finished["best_step"]) == (8, result["best_step"])
    exported = yaml.safe_load((model / "train_config.yaml").read_text())
    assert exported["run_id"] == finished["run_id"] == result["run_id"]


def test_tensorboard_scalars(tmp_path, data, tiny_model_dir):
    _train(
        _config(max_steps=2, eval_every_steps=2, tensorboard=True), data, tiny_model_dir, tmp_path
    )
    assert list((tmp_path / "state" / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("constant", [0.5, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [0.5, 1.0, 1.0, 2 / 3, 1 / 3]),  # the update after 4 steps of 5
        ("cosine", [0.5, 1.0, 1.0, 0.75, 0.25]),
    ],
)
def test_schedules(kind, expected):
    factors = [
        lr_factor(step, kind, warmup_steps=2, max_steps=5, min_ratio=0.0) for step in range(5)
    ]
    assert factors == pytest.approx(expected)


def test_no_weight_decay_on_biases_and_norms(tiny_t5):
    decay, no_decay = parameter_groups(tiny_t5, weight_decay=0.01)
    names = {id(p): n for n, p in tiny_t5.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert no_decay_names and all("layer_norm" in n for n in no_decay_names)
    assert all("layer_norm" not in names[id(p)] for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01
    linear = torch.nn.Linear(3, 3)
    _, groups = parameter_groups(torch.nn.Sequential(linear, torch.nn.LayerNorm(3)), 0.1)
    assert len(groups["params"]) == 3  # bias + norm weight + norm bias


def test_accumulation_matches_a_larger_batch(tiny_model_dir, tmp_path, data):
    """2 micro-batches of 3 accumulate to the gradient of one batch of 6."""
    from fid.data.examples import load_examples
    from fid.models.loading import load_reader
    from fid.training.reader import ReaderTask

    cfg = _config(dropout=0.0)
    reader, tokenizer = load_reader(str(tiny_model_dir), 2, True, dropout=0.0)
    examples = load_examples(data[0])
    for example in examples:  # equal target lengths: the micro-batch means weigh alike
        example.target = "x y"
    task = ReaderTask(reader, tokenizer, cfg, examples, [], torch.device("cpu"))
    reader.train()
    (task.loss(reader, (0, [0, 1, 2])) / 2 + task.loss(reader, (0, [3, 4, 5])) / 2).backward()
    accumulated = [p.grad.clone() for p in reader.parameters()]
    reader.zero_grad()
    task.loss(reader, (0, [0, 1, 2, 3, 4, 5])).backward()
    for a, b in zip(accumulated, (p.grad for p in reader.parameters()), strict=True):
        torch.testing.assert_close(a, b)


def test_a_log_line_counts_its_steps_alone(tmp_path, data, tiny_model_dir, monkeypatch):
    """Dev evaluation and checkpoint saving between steps stay out of the next line's
    step_time_s (and its peak): each eval here sleeps 2.5 s after every 2nd step, which put
    1.25 s a step into the following line before (issue 43, item 6)."""
    import time

    evaluate = reader_training.ReaderTask.evaluate

    def slow_evaluate(self):
        time.sleep(2.5)
        return evaluate(self)

    monkeypatch.setattr(reader_training.ReaderTask, "evaluate", slow_evaluate)
    cfg = _config(eval_every_steps=2, save_every_steps=2, log_every_steps=2, dropout=0.0)
    _train(cfg, data, tiny_model_dir, tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "model" / "metrics.jsonl").open()]
    times = [r["step_time_s"] for r in lines if r["kind"] == "train"]
    assert len(times) == 4 and max(times) < 1.0, times
