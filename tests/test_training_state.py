"""A run's hold on its state folder: one run at a time, leftovers of killed runs swept, resume
refused under a changed config, time-based checkpoints, and decisions all ranks take alike."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types

import pytest
import torch
import yaml
from conftest import write_json

from fid.cli import main
from fid.config import ConfigError, ReaderTrainConfig, RetrieverTrainConfig
from fid.training import loop, runs
from fid.training import reader as reader_training
from fid.training.resume import REFUSED, WARNED, check_resume_config
from fid.training.state_lock import hold_state

TRAIN = dict(
    n_passages=3,
    passage_max_tokens=32,
    batch_size_per_device=2,
    max_steps=2,
    warmup_steps=1,
    eval_every_steps=2,
    save_every_steps=2,
    log_every_steps=1,
    eval_batch_size=4,
    max_new_tokens=3,
    precision="fp32",
    tensorboard=False,
)


@pytest.fixture
def files(tmp_path, toy_records):
    return {
        "train": write_json(tmp_path / "train.json", toy_records["train"][:6]),
        "dev": write_json(tmp_path / "dev.json", toy_records["dev"][:2]),
    }


def _run(tmp_path, files, model_dir, **overrides) -> int:
    """`fid train-reader` in this process, on tmp_path/out/{model,state}: its exit status."""
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({**TRAIN, **overrides}))
    return main([
        "train-reader", "--config", str(config), "--train", str(files["train"]),
        "--dev", str(files["dev"]), "--init-model", str(model_dir),
        "--output", str(tmp_path / "out" / "model"), "--state-dir", str(tmp_path / "out" / "state"),
    ])  # fmt: skip


def _killed_while_exporting(tmp_path, files, model_dir, monkeypatch) -> None:
    """`_run` killed after its last checkpoint, before its export: an unfinished state, which
    the next run resumes (a finished one it would set aside and train anew)."""

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("simulated kill")

    with monkeypatch.context() as patch:
        patch.setattr(runs, "export_best_model", killed)
        with pytest.raises(KeyboardInterrupt):
            _run(tmp_path, files, model_dir)
    assert (tmp_path / "out" / "state" / "step-2").is_dir()


_HOLD = """
import sys, time
from fid.training.state_lock import hold_state
with hold_state(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_run_exits_at_once_naming_the_holder(tmp_path, files, tiny_model_dir, caplog):
    state = tmp_path / "out" / "state"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(state)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        building = state / ".step-9.ab12cd.tmp"  # the holder's: a refused run must not sweep it
        building.mkdir()
        assert _run(tmp_path, files, tiny_model_dir) == 1
        message = f"state folder {state} is in use by another run (pid {holder.pid} on host "
        assert message + socket.gethostname() in caplog.text
        assert not list(state.glob("step-*")) and not (tmp_path / "out" / "model").exists()
        assert building.is_dir()
    finally:
        holder.send_signal(signal.SIGKILL)  # the kernel releases a killed holder's lock
        holder.wait()
    assert _run(tmp_path, files, tiny_model_dir) == 0
    assert (state / "step-2").is_dir() and not building.exists()


def test_a_finished_state_is_set_aside_by_its_holder_alone(tmp_path, files, tiny_model_dir, caplog):
    """--state-dir: a finished run's files are set aside inside the folder (its path, lock file
    and log stay), by the run that holds it; a run refused because another holds it moves
    nothing."""
    assert _run(tmp_path, files, tiny_model_dir) == 0
    state = tmp_path / "out" / "state"
    first = json.loads((state / "run.json").read_text())["run_id"]
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(state)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        assert _run(tmp_path, files, tiny_model_dir) == 1
        assert "is in use by another run" in caplog.text
        assert (state / "finished.json").is_file() and not (state / "finished").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    caplog.clear()
    assert _run(tmp_path, files, tiny_model_dir) == 0
    kept = state / "finished" / first
    assert f"by run {first}; training again from the start" in caplog.text
    assert "starting a new run" in caplog.text and (kept / "step-2").is_dir()
    assert {"run.lock", "train.log", "step-2", "finished.json"} <= {p.name for p in state.iterdir()}
    assert json.loads((state / "run.json").read_text())["run_id"] != first


def test_leftovers_of_killed_runs_are_swept_and_nothing_else(tmp_path, files, tiny_model_dir):
    state, out = tmp_path / "out" / "state", tmp_path / "out"
    leftovers = [state / ".step-4.tmp", state / ".step-2.x1_y2.tmp", state / ".best_dev.k9.tmp",
                 out / ".model.ab12cd.tmp"]  # fmt: skip
    kept = [state / "notes.tmp", state / ".keep", state / "step-1.tmp", out / ".model.v2.ab12.tmp",
            out / ".other.ab12cd.tmp", out / "model.ab12cd.tmp", out / ".model-b.ab12cd.tmp"]  # fmt: skip
    for path in leftovers + kept:
        path.mkdir(parents=True)
        (path / "weights").write_text("x")
    (state / ".latest.tmp").symlink_to("step-4")
    assert _run(tmp_path, files, tiny_model_dir) == 0
    for path in leftovers + [state / ".latest.tmp"]:
        assert not os.path.lexists(path), path
    for path in kept:
        assert (path / "weights").read_text() == "x", path
    assert (out / "model" / "model.safetensors").is_file()


def test_resume_refuses_a_changed_schedule_and_allows_cadences(
    tmp_path, files, tiny_model_dir, caplog, monkeypatch
):
    _killed_while_exporting(tmp_path, files, tiny_model_dir, monkeypatch)
    caplog.clear()
    assert _run(tmp_path, files, tiny_model_dir, lr=3e-4, seed=5) == 1
    assert "lr: 0.0001 -> 0.0003" in caplog.text and "seed: 0 -> 5" in caplog.text
    assert "step-2 was trained with another config" in caplog.text
    caplog.clear()
    assert _run(tmp_path, files, tiny_model_dir, eval_every_steps=1, log_every_steps=2) == 0
    assert "resuming" in caplog.text and "eval_every_steps: 2 -> 1" in caplog.text
    assert "resumed from" in caplog.text


def test_resume_refuses_other_training_data_and_accepts_a_moved_copy(
    tmp_path, files, tiny_model_dir, toy_records, caplog, monkeypatch
):
    _killed_while_exporting(tmp_path, files, tiny_model_dir, monkeypatch)
    caplog.clear()
    other = dict(files, train=write_json(tmp_path / "other.json", toy_records["train"][6:12]))
    assert _run(tmp_path, other, tiny_model_dir) == 1
    assert "step-2 was trained on other data" in caplog.text
    assert f"train: {files['train']}" in caplog.text and str(other["train"]) in caplog.text
    caplog.clear()
    moved = dict(files, train=tmp_path / "moved.json")
    moved["train"].write_bytes(files["train"].read_bytes())  # the same data elsewhere
    assert _run(tmp_path, moved, tiny_model_dir) == 0
    assert "resumed from" in caplog.text
    record = yaml.safe_load((tmp_path / "out" / "model" / "train_config.yaml").read_text())
    train = record["inputs"]["train"]  # provenance: what the exported model was trained on
    assert train["path"] == str(moved["train"])
    assert train["sha256"] == hashlib.sha256(files["train"].read_bytes()).hexdigest()


def test_every_training_knob_has_a_resume_rule():
    assert not REFUSED & WARNED
    for cls in (ReaderTrainConfig, RetrieverTrainConfig):
        for field in dataclasses.fields(cls):
            assert field.name in REFUSED | WARNED, f"{cls.__name__}.{field.name}"


def test_an_unlisted_knob_is_refused_and_a_new_default_is_no_change():
    @dataclasses.dataclass(frozen=True)
    class Newer(ReaderTrainConfig):
        brand_new_knob: int = 1

    saved = dataclasses.asdict(ReaderTrainConfig())
    assert check_resume_config(saved, Newer(), "ckpt") == []  # absent = the default
    with pytest.raises(ConfigError, match=r"brand_new_knob: \(absent, default 1\) -> 2"):
        check_resume_config(saved, Newer(brand_new_knob=2), "ckpt")
    del saved["save_every_minutes"]  # a checkpoint older than the knob
    changes = check_resume_config(saved, ReaderTrainConfig(save_every_minutes=30), "ckpt")
    assert changes == ["save_every_minutes: (absent, default None) -> 30"]


@pytest.mark.parametrize("minutes", [-1.0, float("nan"), float("inf")])
def test_save_every_minutes_is_positive_and_finite(minutes):
    with pytest.raises(ConfigError, match="save_every_minutes"):
        ReaderTrainConfig(save_every_minutes=minutes)
    assert ReaderTrainConfig(save_every_minutes=0).save_every_minutes == 0  # off


def test_checkpoints_on_a_timer(tmp_path, data_files, tiny_model_dir, monkeypatch):
    """Each micro-batch takes 20 s of a fake clock: with one every minute and no step cadence,
    checkpoints land on steps 3 and 6 (and the last, 7)."""
    now = [1000.0]
    monkeypatch.setattr(
        loop,
        "time",
        types.SimpleNamespace(monotonic=lambda: now[0], perf_counter=time.perf_counter),
    )
    original = reader_training.ReaderTask.loss

    def slow_loss(self, model, item):
        now[0] += 20
        return original(self, model, item)

    monkeypatch.setattr(reader_training.ReaderTask, "loss", slow_loss)
    cfg = ReaderTrainConfig(**{**TRAIN, "max_steps": 7, "eval_every_steps": 0,
                               "save_every_steps": 0, "save_every_minutes": 1,
                               "keep_last_checkpoints": 10})  # fmt: skip
    reader_training.train_reader(cfg, *data_files, str(tiny_model_dir), tmp_path / "model",
                                 tmp_path / "state", torch.device("cpu"))  # fmt: skip
    steps = sorted(int(p.name[5:]) for p in (tmp_path / "state").glob("step-*"))
    assert steps == [3, 6, 7]


@pytest.fixture
def data_files(files):
    return files["train"], files["dev"]


# One rank of a 2-process gloo group: the decisions that every rank must take alike.
_RANK = """
import datetime, json, os, sys
import torch, torch.distributed as dist
from fid.runtime import distributed
from fid.training.checkpoint import TrainingProgress
from fid.training import loop
from fid.training.state_lock import StateInUse, hold_state
rank, port, state, busy, result = int(sys.argv[1]), sys.argv[2], *sys.argv[3:]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
cpu, out = torch.device("cpu"), {}
ahead = TrainingProgress(step=4, best_metric=0.4)  # different floats: both take rank 0's branch
out["rank0_better"] = loop._new_best(ahead, 0.5 if rank == 0 else 0.3)
behind = TrainingProgress(step=4, best_metric=0.4)
out["rank1_better"] = loop._new_best(behind, 0.3 if rank == 0 else 0.5)
out["best"] = [ahead.best_metric, behind.best_metric]
out["timer"] = [distributed.main_rank_flag(rank == 0, cpu), distributed.main_rank_flag(rank == 1, cpu)]
try:  # held by the test process: every rank ends, none waits for rank 0
    with hold_state(busy):
        out["busy"] = "entered"
except StateInUse as error:
    out["busy"] = str(error)
with hold_state(state):
    out["holder"] = open(os.path.join(state, "run.lock")).read()
    dist.barrier()
open(result, "w").write(json.dumps(out))
dist.destroy_process_group()
"""


def test_ranks_take_the_same_decisions(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    busy, state = tmp_path / "busy", tmp_path / "state"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with hold_state(busy):
        ranks = [subprocess.Popen([sys.executable, "-c", _RANK, str(rank), str(port), str(state),
                                   str(busy), str(tmp_path / f"{rank}.json")], env=env)
                 for rank in (0, 1)]  # fmt: skip
        for process in ranks:
            assert process.wait(timeout=120) == 0
    out = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    for result in out:
        assert result["rank0_better"] is True and result["rank1_better"] is False
        assert result["best"] == [0.5, 0.4] and result["timer"] == [True, False]
        assert f"in use by another run (pid {os.getpid()}" in result["busy"]
    assert out[1]["busy"].startswith("rank 0 could not take the state folder")
    assert json.loads(out[0]["holder"])["pid"] == ranks[0].pid
