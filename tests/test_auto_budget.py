"""`max_tokens_per_batch: auto` (issue 28, item 2): the reader's budget from the memory plan and
the memory at the run's first start, recorded in the state folder for every later start."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml
from conftest import write_json
from safetensors.torch import load_file

from fid.cli import main
from fid.config import ConfigError, ReaderTrainConfig, RetrieverTrainConfig
from fid.config.loading import load_config
from fid.memory.auto_budget import (
    BUDGET_FILE,
    MEMORY_ENV,
    USABLE_SHARE,
    available_memory,
    resolve_token_budget,
)
from fid.memory.command_plans import command_plan_inputs
from fid.memory.plan import MemoryDoesNotFit, plan_step

CPU = torch.device("cpu")
CONFIG = dict(
    n_passages=4, passage_max_tokens=32, batch_size_per_device=4, gradient_accumulation_steps=2,
    max_tokens_per_batch="auto", max_steps=4, warmup_steps=1, eval_every_steps=4,
    save_every_steps=2, keep_last_checkpoints=4, log_every_steps=1, eval_batch_size=4,
    max_new_tokens=4, tensorboard=False, deterministic=True, dropout=0.0,
)  # fmt: skip


def _peak(cfg: ReaderTrainConfig, model, questions: int) -> int:
    full = dataclasses.replace(cfg, max_tokens_per_batch=None, batch_size_per_device=questions)
    return plan_step(command_plan_inputs("train-reader", full, str(model), 1, "cpu")).peak


def _memory_for(cfg, model, questions: int) -> int:
    """Free memory in which exactly `questions` full-size questions fit."""
    between = (_peak(cfg, model, questions) + _peak(cfg, model, questions + 1)) // 2
    return int(between / USABLE_SHARE)


@pytest.fixture
def cfg():
    return ReaderTrainConfig(**CONFIG)


def test_auto_is_a_config_value_and_the_retriever_refuses_it(tmp_path):
    path = tmp_path / "c.yaml"
    for value, error in (("auto", None), ("big", "wrong type"), (0, "out of range")):
        path.write_text(yaml.safe_dump({"max_tokens_per_batch": value}))
        if error is None:
            assert load_config(path, ReaderTrainConfig).max_tokens_per_batch == "auto"
        else:
            with pytest.raises(ConfigError, match=error):
                load_config(path, ReaderTrainConfig)
    for value in ("auto", 4096):  # a number would be ignored: its batch is in questions
        path.write_text(yaml.safe_dump({"max_tokens_per_batch": value}))
        with pytest.raises(ConfigError, match=f"{value!r} is the reader's.*in-batch negatives"):
            load_config(path, RetrieverTrainConfig)


def test_the_budget_fits_and_a_smaller_memory_gets_a_smaller_one(
    cfg, tiny_model_dir, tmp_path, monkeypatch
):
    chosen = {}
    for questions in (4, 2, 1):
        memory = _memory_for(cfg, tiny_model_dir, questions) if questions < 4 else 10**12
        monkeypatch.setenv(MEMORY_ENV, str(memory))
        state = tmp_path / f"state-{questions}"
        resolved = resolve_token_budget(cfg, str(tiny_model_dir), state, CPU)
        chosen[questions] = resolved
        assert resolved.max_tokens_per_batch == questions * 4 * 32
        # the config's 4 x 2 questions a step, in micro-batches of `questions`
        assert resolved.gradient_accumulation_steps == 2 * (4 // questions)
        assert _peak(cfg, tiny_model_dir, questions) <= memory * USABLE_SHARE
        record = json.loads((state / BUDGET_FILE).read_text())
        assert record["max_tokens_per_batch"] == resolved.max_tokens_per_batch
        assert record["memory_bytes"] == memory and record["memory_source"] == MEMORY_ENV
    budgets = [chosen[q].max_tokens_per_batch for q in (4, 2, 1)]
    assert budgets == sorted(budgets, reverse=True) and len(set(budgets)) == 3


def test_a_memory_below_one_question_is_one_clear_error(cfg, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(MEMORY_ENV, "1MiB")
    with pytest.raises(MemoryDoesNotFit) as caught:
        resolve_token_budget(cfg, str(tiny_model_dir), tmp_path / "state", CPU)
    message = str(caught.value)
    assert "not even one question of 4 x 32 tokens fits" in message and MEMORY_ENV in message
    assert "peak per rank" in message and "optimizer" in message  # the plan's table
    assert "each of these would make it fit" in message or "smaller model" in message
    assert not (tmp_path / "state" / BUDGET_FILE).exists()


def test_nonsense_memory_and_a_broken_record_are_config_errors(
    cfg, tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(ConfigError, match=MEMORY_ENV):
        available_memory(CPU)
    monkeypatch.delenv(MEMORY_ENV)
    assert available_memory(CPU)[0] > 0
    state = tmp_path / "state"
    state.mkdir()
    (state / BUDGET_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match=f"{BUDGET_FILE}: does not hold the run's token budget"):
        resolve_token_budget(cfg, str(tiny_model_dir), state, CPU)


def test_every_later_start_keeps_the_first_choice_and_resume_stays_bitwise(
    cfg, tiny_model_dir, tmp_path, toy_records, monkeypatch, caplog
):
    """A run chosen at 2 questions a micro-batch, 'killed' after its step-2 checkpoint (the
    later checkpoint and the model removed) and started again where not even one question would
    fit: it reads its recorded budget, resumes, and ends bitwise equal to the run not killed."""
    train = write_json(tmp_path / "train.json", toy_records["train"][:8])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:4])
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(CONFIG))

    def run(name: str, memory: int | str) -> int:
        monkeypatch.setenv(MEMORY_ENV, str(memory))
        return main(["train-reader", "--config", str(config), "--train", str(train), "--dev",
                     str(dev), "--init-model", str(tiny_model_dir), "--output",
                     str(tmp_path / name / "model"), "--state-dir", str(tmp_path / name / "state")])  # fmt: skip

    two = _memory_for(cfg, tiny_model_dir, 2)
    assert run("straight", two) == 0
    assert "max_tokens_per_batch: auto -> 256 (2 question(s) of 4 x 32 tokens" in caplog.text
    assert run("killed", two) == 0
    state = tmp_path / "killed" / "state"
    saved = torch.load(state / "step-2" / "training_state.pt", weights_only=True)["config"]
    assert saved["max_tokens_per_batch"] == 256 and saved["gradient_accumulation_steps"] == 4
    for path in [state / "step-4", tmp_path / "killed" / "model"]:
        for file in sorted(path.rglob("*"), reverse=True):
            file.unlink() if file.is_file() else file.rmdir()
        path.rmdir()
    (state / "latest").unlink(missing_ok=True)
    caplog.clear()
    assert run("killed", "1MiB") == 0  # a fresh choice would fail: the record decides
    assert "as chosen at the run's first start" in caplog.text
    one, other = (load_file(tmp_path / n / "model" / "model.safetensors") for n in ("straight",
                                                                                 "killed"))  # fmt: skip
    assert one.keys() == other.keys() and all(one[k].equal(other[k]) for k in one)


def test_each_rank_plans_its_own_gpus_free_memory(monkeypatch):
    """One GPU a task (srun --gpus-per-task=1): each rank sees one GPU and SLURM says 4 tasks on
    the node; the plan divided the GPU's free memory by 4 (review of issue 43). One rank a GPU
    is enforced (distributed.setup), so a rank has its GPU's free memory to itself."""
    import torch

    monkeypatch.delenv("FID_AVAILABLE_MEMORY", raising=False)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (80 << 30, 80 << 30))
    memory, where = available_memory(torch.device("cuda", 0))
    assert (memory, where) == (80 << 30, "free on cuda:0")
