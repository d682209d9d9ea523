"""Damaged checkpoints: resume verifies the newest, falls back to the newest that verifies, and
says which one it skipped and why; with none left, one clear error names the state folder."""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest
import torch
import yaml
from conftest import assert_same_weights, write_json

from fid.cli import main
from fid.training import checkpoint
from fid.training import manifest as manifests
from fid.training import reader as reader_training

# Eval only at the end: best_dev is the final model, so runs compare by their exported weights.
TRAIN = dict(
    n_passages=3,
    passage_max_tokens=32,
    batch_size_per_device=2,
    max_steps=4,
    lr=1e-3,
    warmup_steps=1,
    eval_every_steps=0,
    save_every_steps=1,
    keep_last_checkpoints=5,
    log_every_steps=1,
    eval_batch_size=4,
    max_new_tokens=3,
    dropout=0.1,  # dropout draws random numbers: their state must survive the fallback too
    precision="fp32",
    tensorboard=False,
)


def _args(files, model_dir, root):
    return [
        "train-reader", "--config", str(files["config"]), "--train", str(files["train"]),
        "--dev", str(files["dev"]), "--init-model", str(model_dir),
        "--output", str(root / "model"), "--state-dir", str(root / "state"),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory, toy_records, tiny_model_dir):
    """An uninterrupted run, and the state folder of a run killed inside step 4 (step-1..3)."""
    root = tmp_path_factory.mktemp("runs")
    files = {
        "train": write_json(root / "train.json", toy_records["train"][:8]),
        "dev": write_json(root / "dev.json", toy_records["dev"][:2]),
        "config": root / "train.yaml",
    }
    files["config"].write_text(yaml.safe_dump(TRAIN))
    torch.manual_seed(0)
    assert main(_args(files, tiny_model_dir, root / "straight")) == 0

    original_loss = reader_training.ReaderTask.loss
    calls = {"n": 0}

    def crashing_loss(self, model, item):
        calls["n"] += 1
        if calls["n"] == 4:  # inside step 4, after the checkpoint of step 3
            raise KeyboardInterrupt("simulated kill")
        return original_loss(self, model, item)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader_training.ReaderTask, "loss", crashing_loss)
        torch.manual_seed(0)
        with pytest.raises(KeyboardInterrupt):
            main(_args(files, tiny_model_dir, root / "crashed"))
    state = root / "crashed" / "state"
    assert sorted(p.name for p in state.glob("step-*")) == ["step-1", "step-2", "step-3"]
    return {"files": files, "straight": root / "straight", "crashed": state}


def _copy_crashed(runs, tmp_path):
    shutil.copytree(runs["crashed"], tmp_path / "state", symlinks=True)
    return tmp_path / "state"


def _reseal(folder):
    """A checkpoint whose manifest matches its (bad) files: what a buggy writer would leave."""
    if (folder / manifests.MANIFEST).exists():
        (folder / manifests.MANIFEST).unlink()
        manifests.seal_checkpoint(folder)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_weight_bytes(path):
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")  # safetensors: u64 header size, header
    middle = (header + len(data)) // 2  # inside the tensor data: the file still loads
    data[middle : middle + 4] = bytes(b ^ 0xFF for b in data[middle : middle + 4])
    path.write_bytes(bytes(data))


def _edit_state(folder, edit):
    state = torch.load(folder / "training_state.pt", weights_only=True)
    edit(state)
    torch.save(state, folder / "training_state.pt")
    _reseal(folder)


def _wrong_checksum(folder):
    manifest = json.loads((folder / manifests.MANIFEST).read_text())
    record = manifest["files"]["training_state.pt"]
    key = manifest["checksum"]
    record[key] = "0" * len(record[key])
    (folder / manifests.MANIFEST).write_text(json.dumps(manifest))


def _legacy(state_dir, damage=None):
    """A state folder written before checkpoints carried a manifest."""
    for manifest in state_dir.glob(f"step-*/{manifests.MANIFEST}"):
        manifest.unlink()
    if damage is not None:
        damage(state_dir / "step-3")


CORRUPTIONS = {
    "truncated weights": (lambda f: _truncate(f / "model.safetensors"), "model.safetensors"),
    "flipped bytes in weights": (lambda f: _flip_weight_bytes(f / "model.safetensors"), "checksum"),
    "emptied weights": (lambda f: (f / "model.safetensors").write_bytes(b""), "model.safetensors"),
    "missing optimizer": (lambda f: _edit_state(f, lambda s: s.pop("optimizer")), "optimizer"),
    "null optimizer": (lambda f: _edit_state(f, lambda s: s.update(optimizer=None)), "optimizer"),
    "missing progress key": (
        lambda f: _edit_state(f, lambda s: s["progress"].pop("epoch")),
        "progress",
    ),
    "missing training state": (lambda f: (f / "training_state.pt").unlink(), "training_state"),
    "truncated training state": (lambda f: _truncate(f / "training_state.pt"), "training_state"),
    "missing manifest": (lambda f: (f / manifests.MANIFEST).unlink(), manifests.MANIFEST),
    "manifest mismatch": (_wrong_checksum, "checksum"),
    "file not in the manifest": (lambda f: (f / "notes.txt").write_text("x"), "notes.txt"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(
    case, runs, tmp_path, tiny_model_dir, caplog
):
    corrupt, reason = CORRUPTIONS[case]
    state = _copy_crashed(runs, tmp_path)
    corrupt(state / "step-3")
    assert main(_args(runs["files"], tiny_model_dir, tmp_path)) == 0

    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(str(state / "step-3") in w and reason in w for w in warnings), warnings
    assert f"resumed from {state / 'step-2'}" in caplog.text
    _assert_same_weights(runs["straight"], tmp_path)
    # The abandoned step-3 is replaced by the resumed run's own.
    manifests.verify_checkpoint(state / "step-3")


@pytest.mark.parametrize("damage", [None, lambda f: _truncate(f / "model.safetensors")])
def test_checkpoints_without_a_manifest_resume_unverified(
    damage, runs, tmp_path, tiny_model_dir, caplog
):
    """Checkpoints of an older fid: the newest that loads, with a warning that it cannot be
    verified (a flipped weight would go unseen); load errors still fall back."""
    state = _copy_crashed(runs, tmp_path)
    _legacy(state, damage)
    assert main(_args(runs["files"], tiny_model_dir, tmp_path)) == 0
    resumed = state / ("step-3" if damage is None else "step-2")
    assert f"resumed from {resumed}" in caplog.text
    assert f"{resumed}: no {manifests.MANIFEST}" in caplog.text
    assert "cannot be verified" in caplog.text
    _assert_same_weights(runs["straight"], tmp_path)


def test_no_checkpoint_verifies_one_clear_error(runs, tmp_path, tiny_model_dir, caplog):
    state = _copy_crashed(runs, tmp_path)
    for folder in state.glob("step-*"):
        _truncate(folder / "model.safetensors")
    assert main(_args(runs["files"], tiny_model_dir, tmp_path)) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and str(state) in errors[0], errors
    assert all(f"step-{n}" in errors[0] for n in (1, 2, 3))
    assert "Traceback" not in caplog.text
    assert not (tmp_path / "model").exists()


def _assert_same_weights(straight_root, resumed_root):
    assert_same_weights(straight_root / "model" / "model.safetensors",
                        resumed_root / "model" / "model.safetensors")  # fmt: skip


def test_two_writers_of_latest_do_not_collide(tmp_path, monkeypatch):
    """Two runs pointing `latest` at once: each builds its link under its own temporary name
    (a fixed `.latest.tmp` made the second symlink() fail with FileExistsError)."""
    (tmp_path / "step-1").mkdir()
    (tmp_path / "step-2").mkdir()
    # Both runs make their link before either renames it to `latest`.
    before, after = threading.Barrier(2, timeout=10), threading.Barrier(2, timeout=10)
    real_symlink = os.symlink

    def symlink_together(source, link):
        before.wait()
        try:
            real_symlink(source, link)
        finally:
            after.wait()

    monkeypatch.setattr(checkpoint.os, "symlink", symlink_together)
    errors = []

    def point(name):
        try:
            checkpoint._point_latest(tmp_path, name)
        except OSError as error:
            errors.append(error)

    threads = [threading.Thread(target=point, args=(f"step-{n}",)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert os.readlink(tmp_path / "latest") in ("step-1", "step-2")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.slow
def test_sharded_checkpoints_verify_every_rank_shards(tmp_path, tiny_model_dir, toy_records):
    """FSDP: the manifest lists every rank's shards; a flipped shard byte falls back."""
    from test_distributed import launch

    files = {
        "train": write_json(tmp_path / "train.json", toy_records["train"][:8]),
        "dev": write_json(tmp_path / "dev.json", toy_records["dev"][:2]),
        "config": tmp_path / "train.yaml",
    }
    files["config"].write_text(yaml.safe_dump(dict(TRAIN, dropout=0.0, sharding="fsdp")))
    launch(_args(files, tiny_model_dir, tmp_path / "straight"), 2, tmp_path)
    state = tmp_path / "straight" / "state"
    listed = json.loads((state / "step-3" / manifests.MANIFEST).read_text())["files"]
    shards = sorted(
        p.relative_to(state / "step-3").as_posix() for p in state.glob("step-3/sharded/*")
    )
    assert len(shards) >= 3 and set(shards) <= listed.keys()  # .metadata, one file per rank
    assert sorted(p.name for p in state.iterdir() if p.name.startswith(".")) == []

    # The run killed after step 3's checkpoint, whose first rank's shard then lost a byte.
    resumed = tmp_path / "resumed"
    shutil.copytree(state, resumed / "state", symlinks=True)
    shutil.rmtree(resumed / "state" / "step-4")
    (resumed / "state" / "finished.json").unlink()  # it never got as far as its export
    shard = next(p for p in sorted((resumed / "state/step-3/sharded").glob("*.distcp")))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    logs = launch(_args(files, tiny_model_dir, resumed), 2, tmp_path)
    assert f"{resumed / 'state' / 'step-3'}: sharded/{shard.name} does not match" in logs[0]
    assert f"resumed from {resumed / 'state' / 'step-2'}" in logs[0]
    _assert_same_weights(tmp_path / "straight", resumed)


def test_pruning_drops_checkpoints_newer_than_the_one_saved(tmp_path):
    """After a fallback the run goes on from an older step: a damaged newer checkpoint that the
    run does not overwrite must not count among the last K (with K=1 it pushed out the new one)."""
    for step in (2, 4, 5):
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / "training_state.pt").write_bytes(b"")
    checkpoint.publish_checkpoint(tmp_path, tmp_path / "step-4", keep_last=1)
    assert [path.name for _, path in checkpoint.step_checkpoints(tmp_path)] == ["step-4"]
    assert os.readlink(tmp_path / "latest") == "step-4"
