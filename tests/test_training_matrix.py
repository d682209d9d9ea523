"""Every precision x sharding x model x accumulation a CPU can run: 3 optimizer steps on 2 gloo
ranks (one process for "none"), then a resume after a kill, bitwise equal to the run that was
not interrupted; FSDP equal to DDP within fp32 round-off. What a CPU cannot run is refused with
one error naming why (fp16 needs CUDA; fp16 + fsdp, and fsdp for the retriever, are refused
everywhere).

The kill: the run wrote a checkpoint after every step; everything after step 1 is deleted (the
later checkpoints, the exported model, the finished record), which is the state folder a run
killed right after step 1's checkpoint leaves. The rerun resumes from it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from conftest import scored_retriever_inputs
from safetensors.torch import load_file
from test_distributed import launch

from fid.cli import main

pytestmark = pytest.mark.slow

STEPS = 3
# sharding -> (ranks, the config's sharding knob)
SHARDINGS = {"none": (1, "ddp"), "ddp": (2, "ddp"), "fsdp": (2, "fsdp")}
WEIGHTS = {"reader": "model.safetensors", "retriever": "question_encoder/model.safetensors"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir, toy_records):
    """Reader and retriever data and start models, built once for the module."""
    root = tmp_path_factory.mktemp("matrix")
    train, dev, bert = scored_retriever_inputs(root, toy_records, 16, 4, 3)
    return {"root": root, "train": train, "dev": dev,
            "reader": tiny_model_dir, "retriever": bert}  # fmt: skip


def _config(path: Path, model: str, precision: str, sharding: str, accumulation: int) -> Path:
    knobs = dict(
        batch_size_per_device=2, gradient_accumulation_steps=accumulation, max_steps=STEPS,
        lr=1e-3, warmup_steps=1, eval_every_steps=STEPS, save_every_steps=1,
        keep_last_checkpoints=STEPS, log_every_steps=1, precision=precision, sharding=sharding,
        tensorboard=False, n_passages=3, passage_max_tokens=32,
    )  # fmt: skip
    if model == "reader":
        knobs.update(eval_batch_size=2, max_new_tokens=3, dropout=0.1)
    else:
        knobs.update(question_max_tokens=16, eval_k=[1, 2], select_on="candidate_agreement@1")
    path.write_text(yaml.safe_dump(knobs))
    return path


def _train(inputs, model, config, output, state, ranks) -> None:
    args = [f"train-{model}", "--config", config, "--train", inputs["train"], "--dev",
            inputs["dev"], "--init-model", inputs[model], "--output", output, "--state-dir", state]  # fmt: skip
    launch(args, ranks, inputs["root"])


def _kill_after_step_1(output: Path, state: Path) -> None:
    for step in range(2, STEPS + 1):
        shutil.rmtree(state / f"step-{step}")
    shutil.rmtree(output)
    (state / "finished.json").unlink()
    latest = state / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
        latest.symlink_to("step-1")


@pytest.mark.parametrize("accumulation", [1, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("model", ["reader", "retriever"])
def test_every_combination_resumes_bitwise_and_fsdp_equals_ddp(
    inputs, tmp_path, model, precision, accumulation
):
    exported = {}
    for name, (ranks, sharding) in SHARDINGS.items():
        if model == "retriever" and sharding == "fsdp":
            continue  # refused: test_refused_combinations
        config = _config(tmp_path / f"{name}.yaml", model, precision, sharding, accumulation)
        output, state = tmp_path / f"model-{name}", tmp_path / f"state-{name}"
        _train(inputs, model, config, output, state, ranks)
        straight = load_file(output / WEIGHTS[model])
        _kill_after_step_1(output, state)
        _train(inputs, model, config, output, state, ranks)
        resumed = load_file(output / WEIGHTS[model])
        assert straight.keys() == resumed.keys()
        for key in straight:
            assert torch.equal(straight[key], resumed[key]), (name, key)
        log = (state / "train.log").read_text()
        assert log.count("resumed from") == 1 and f"resumed from {state / 'step-1'}" in log, name
        exported[name] = straight
    if "fsdp" in exported:
        for key, tensor in exported["ddp"].items():
            torch.testing.assert_close(exported["fsdp"][key], tensor, atol=1e-5, rtol=1e-4,
                                       msg=key)  # fmt: skip


@pytest.mark.parametrize(
    "model, precision, sharding, message",
    [
        (
            "reader",
            "fp16",
            "ddp",
            "precision = 'fp16' needs a CUDA device, but this job runs on cpu",
        ),
        (
            "retriever",
            "fp16",
            "ddp",
            "precision = 'fp16' needs a CUDA device, but this job runs on cpu",
        ),
        ("reader", "fp16", "fsdp", "precision = 'fp16' with sharding = 'fsdp' is refused"),
        ("retriever", "fp32", "fsdp", "sharding = 'fsdp' is refused for the retriever"),
    ],
)
def test_refused_combinations(inputs, tmp_path, capsys, model, precision, sharding, message):
    """One clear error, exit 1, nothing written: in-process, one rank (the refusal comes before
    any process group would matter)."""
    config = _config(tmp_path / "c.yaml", model, precision, sharding, 1)
    status = main([f"train-{model}", "--config", str(config), "--train", str(inputs["train"]),
                   "--dev", str(inputs["dev"]), "--init-model", str(inputs[model]),
                   "--output", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 1, err[-2000:]
    assert message in err, err[-2000:]
    assert "bug in fid" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_emdr2_retriever_training_resumes_bitwise(inputs, tmp_path):
    """The EMDR2 objective trains through the same loop: killed after step 1 and resumed, it
    ends bitwise equal to the uninterrupted run (one process, accumulation 3)."""
    config = _config(tmp_path / "emdr2.yaml", "retriever", "fp32", "ddp", 3)
    knobs = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**knobs, "objective": "emdr2"}))
    output, state = tmp_path / "model", tmp_path / "state"
    _train(inputs, "retriever", config, output, state, 1)
    straight = load_file(output / WEIGHTS["retriever"])
    _kill_after_step_1(output, state)
    _train(inputs, "retriever", config, output, state, 1)
    resumed = load_file(output / WEIGHTS["retriever"])
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[key], resumed[key]) for key in straight)
    assert "resumed from" in (state / "train.log").read_text()
