"""Steps that make no update, and RNG states across machine shapes (issue 29, items 4-5).

A non-finite loss (bf16, fp32) skips its update on every rank, is counted in metrics.jsonl,
and too many in a row stop the run with one error naming the last good checkpoint, the state
kept for a resume; fp16's loss scaler skips an overflow the same way (GradScaler on the CPU
here). A checkpoint's RNG record holds each rank's own device generator, so a run resumes on a
machine with another GPU count (the CUDA calls mocked: no GPU here).
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from conftest import write_json
from safetensors.torch import load_file

from fid.config import ReaderTrainConfig
from fid.training import checkpoint
from fid.training import reader as reader_training
from fid.training.reader import train_reader
from fid.training.update import TrainingDiverged, apply_update


def _config(**changes):
    return ReaderTrainConfig(**{**dict(
        n_passages=3, passage_max_tokens=32, batch_size_per_device=2, max_steps=8, lr=1e-3,
        warmup_steps=1, eval_every_steps=8, save_every_steps=2, log_every_steps=2,
        eval_batch_size=4, max_new_tokens=3, dropout=0.0, precision="fp32", tensorboard=False,
    ), **changes})  # fmt: skip


@pytest.fixture
def data(tmp_path, toy_records):
    return (write_json(tmp_path / "train.json", toy_records["train"][:16]),
            write_json(tmp_path / "dev.json", toy_records["dev"][:4]))  # fmt: skip


def _nan_loss_at(monkeypatch, calls: set[int]):
    """Makes the task's loss NaN at these loss calls (1-based; one call a step here)."""
    original, count = reader_training.ReaderTask.loss, {"n": 0}

    def loss(self, model, item):
        count["n"] += 1
        value = original(self, model, item)
        return value * float("nan") if count["n"] in calls else value

    monkeypatch.setattr(reader_training.ReaderTask, "loss", loss)


def test_a_non_finite_loss_skips_its_update_and_is_counted(
    tmp_path, data, tiny_model_dir, monkeypatch
):
    _nan_loss_at(monkeypatch, {3})
    train_reader(_config(), *data, str(tiny_model_dir), tmp_path / "model", tmp_path / "state",
                 torch.device("cpu"))  # fmt: skip
    weights = load_file(tmp_path / "model" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())  # NaN never reached them
    records = [json.loads(x) for x in (tmp_path / "model" / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["skipped_steps"] for r in train] == [0, 1, 0, 0]
    assert all(r["loss"] == r["loss"] for r in train)  # the logged loss leaves the NaN out


def test_a_diverged_run_stops_naming_its_last_checkpoint_and_resumes(
    tmp_path, data, tiny_model_dir, monkeypatch, caplog
):
    _nan_loss_at(monkeypatch, set(range(5, 100)))  # from step 5 on: diverged
    cfg = _config(max_skipped_steps_in_a_row=3)
    args = (*data, str(tiny_model_dir), tmp_path / "model", tmp_path / "state")
    with pytest.raises(TrainingDiverged, match=r"step 7: 3 optimizer steps in a row made no "
                       r"update .*last good checkpoint is .*step-6 \(step 6\), kept"):  # fmt: skip
        train_reader(cfg, *args, torch.device("cpu"))
    # steps 5 and 6 made no update: step 6's checkpoint holds step 4's weights, none NaN
    assert not (tmp_path / "model").exists() and (tmp_path / "state" / "step-6").is_dir()
    monkeypatch.undo()  # the cause fixed: the same command resumes
    with caplog.at_level(logging.INFO):
        train_reader(cfg, *args, torch.device("cpu"))
    assert "from step 6" in caplog.text and (tmp_path / "model" / "model.safetensors").is_file()


class _NaNGradient(torch.autograd.Function):
    """The identity forward; backward sends NaN: a finite loss with a non-finite gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("nan"))


@pytest.mark.parametrize("clip", [1.0, None])
def test_a_finite_loss_with_a_non_finite_gradient_makes_no_update(
    tmp_path, data, tiny_model_dir, monkeypatch, clip
):
    """Step 3's loss is finite but its gradient NaN: before the check it was applied (every
    weight NaN, the step counted as an update); now it is skipped and counted like a NaN loss,
    with or without clipping."""
    original, count = reader_training.ReaderTask.loss, {"n": 0}

    def loss(self, model, item):
        count["n"] += 1
        value = original(self, model, item)
        return _NaNGradient.apply(value) if count["n"] == 3 else value

    monkeypatch.setattr(reader_training.ReaderTask, "loss", loss)
    train_reader(_config(clip_grad_norm=clip), *data, str(tiny_model_dir), tmp_path / "model",
                 tmp_path / "state", torch.device("cpu"))  # fmt: skip
    weights = load_file(tmp_path / "model" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    records = [json.loads(x) for x in (tmp_path / "model" / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["skipped_steps"] for r in train] == [0, 1, 0, 0]
    assert all(r["loss"] == r["loss"] and r["grad_norm"] == r["grad_norm"] for r in train[2:])


def test_an_fp16_overflow_is_a_skipped_step():
    """GradScaler skips an overflowing step and lowers its scale: no update, counted."""
    layer = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in layer.parameters()]
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(layer(torch.tensor([[float("inf"), 1.0]])).sum()).backward()
    _, updated = apply_update(optimizer, scheduler, scaler, list(layer.parameters()), 1.0,
                              False, True)  # fmt: skip
    assert not updated and scaler.get_scale() < 4.0
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters(), strict=True))
    scaler.scale(layer(torch.tensor([[1.0, 1.0]])).sum()).backward()
    _, updated = apply_update(optimizer, scheduler, scaler, list(layer.parameters()), 1.0,
                              False, True)  # fmt: skip
    assert updated


@pytest.mark.parametrize("saved_devices, here", [(8, 1), (1, 8)])
def test_each_rank_restores_its_own_device_rng_on_another_machine_shape(
    monkeypatch, saved_devices, here
):
    """A rank saves its own device's generator and restores it where the GPU count differs
    (8 visible -> 1 with --gpus-per-task=1, and back); older records of every device load."""
    states = {i: torch.full((8,), i, dtype=torch.uint8) for i in range(max(saved_devices, here))}
    restored = []
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "get_rng_state", lambda device="cuda": states[0])
    monkeypatch.setattr(
        cuda, "get_rng_state_all", lambda: [states[i] for i in range(saved_devices)]
    )
    monkeypatch.setattr(cuda, "set_rng_state", lambda state, device="cuda": restored.append(state))
    monkeypatch.setattr(cuda, "set_rng_state_all", lambda _: pytest.fail("every device's"))
    record = checkpoint.rng_state()
    assert torch.equal(record["cuda"], states[0])  # one device's, whatever the machine
    checkpoint.set_rng_state(record)
    older = {**record, "cuda": [states[i] for i in range(saved_devices)]}  # before: a list
    checkpoint.set_rng_state(older)
    assert [int(s[0]) for s in restored] == [0, 0]
