"""A step that runs out of memory is redone with its micro-batches split
(fid.training.step_oom_recovery).

Out-of-memory errors are simulated with FID_INJECT_OOM="K:TOKENS[:RANK]": from the K-th forward
on, a micro-batch above TOKENS tokens fails, as on a device that holds TOKENS tokens. Tiny
models, dropout 0 where updates are compared with the unsplit run's (the split only reorders
fp32 sums), a few steps each.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import scored_retriever_inputs, write_json
from safetensors.torch import load_file
from test_distributed import _free_port
from test_training_matrix import _kill_after_step_1

from fid.cli import main
from fid.config import ReaderTrainConfig
from fid.data.examples import load_examples
from fid.data.reader_batches import ReaderCollator
from fid.errors import ConfigError
from fid.runtime.oom_injection import INJECT_OOM, Injection
from fid.training.checkpoint import TrainingProgress
from fid.training.manifest import verify_checkpoint
from fid.training.reader import train_reader
from fid.training.retriever import RetrieverTask
from fid.training.step_oom_recovery import StepRecovery, fit, halve

CPU = torch.device("cpu")
STEPS = 3  # as test_training_matrix's _kill_after_step_1 expects
# 3 passages of at most 32 tokens: a question holds at most 96 passage tokens, so a device
# holding 100 fits every single question and no micro-batch of two or more.
FITS_ONE_QUESTION = 100
READER = dict(
    n_passages=3, passage_max_tokens=32, batch_size_per_device=4, max_steps=STEPS, lr=1e-3,
    warmup_steps=1, eval_every_steps=STEPS, save_every_steps=1, keep_last_checkpoints=STEPS,
    log_every_steps=1, eval_batch_size=4, max_new_tokens=3, dropout=0.0, precision="fp32",
    tensorboard=False,
)  # fmt: skip


@pytest.fixture
def data(tmp_path, toy_records):
    return (write_json(tmp_path / "train.json", toy_records["train"][:16]),
            write_json(tmp_path / "dev.json", toy_records["dev"][:4]))  # fmt: skip


def _train(root: Path, data, model_dir, **changes) -> None:
    cfg = ReaderTrainConfig(**{**READER, **changes})
    train_reader(cfg, *data, str(model_dir), root / "model", root / "state", CPU)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def _limit(checkpoint: Path) -> int | None:
    state = torch.load(checkpoint / "training_state.pt", weights_only=True)
    return state["progress"]["micro_batch_token_limit"]


def _assert_close(got: dict, want: dict, atol: float) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=0, msg=name)


def test_a_step_out_of_memory_is_redone_split_and_updates_as_the_unsplit_step(
    tmp_path, data, tiny_model_dir, monkeypatch, caplog
):
    _train(tmp_path / "plain", data, tiny_model_dir)
    monkeypatch.setenv(INJECT_OOM, f"2:{FITS_ONE_QUESTION}")  # from step 2 on
    with caplog.at_level(logging.WARNING, logger="fid"):
        _train(tmp_path / "oom", data, tiny_model_dir)
    # 4 questions failed, then 2, then single questions fitted: two halvings, both told
    lowered = re.findall(r"step 2: out of memory in a micro-batch of (\d+) tokens \(rank 0\); "
                         r"the micro-batch token limit goes from (\w+) to (\d+)", caplog.text)  # fmt: skip
    assert len(lowered) == 2 and lowered[0][1] == "none", caplog.text
    assert lowered[1][1] == lowered[0][2] and int(lowered[1][2]) < int(lowered[0][2])
    final = int(lowered[1][2])
    assert final <= FITS_ONE_QUESTION
    plain, oom = tmp_path / "plain" / "state", tmp_path / "oom" / "state"
    assert _limit(plain / "step-3") is None and _limit(oom / "step-1") is None
    assert _limit(oom / "step-2") == _limit(oom / "step-3") == final  # kept for the run
    assert all(torch.equal(a, b) for a, b in zip(
        _weights(plain / "step-1").values(), _weights(oom / "step-1").values(), strict=True
    ))  # fmt: skip
    for step in (2, 3):  # the recovered step, and one split from the start by the limit
        _assert_close(_weights(oom / f"step-{step}"), _weights(plain / f"step-{step}"), 1e-6)


def test_a_recovered_run_killed_and_resumed_ends_bitwise_equal(
    tmp_path, data, tiny_model_dir, monkeypatch, caplog
):
    """Killed after step 1's recovery and resumed WITHOUT the injection: only the limit in the
    checkpoint makes steps 2-3 split as in the run not killed (with dropout, the split draws
    other random numbers too)."""
    monkeypatch.setenv(INJECT_OOM, f"1:{FITS_ONE_QUESTION}")
    _train(tmp_path, data, tiny_model_dir, dropout=0.1)
    straight = _weights(tmp_path / "model")
    _kill_after_step_1(tmp_path / "model", tmp_path / "state")
    monkeypatch.delenv(INJECT_OOM)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fid"):
        _train(tmp_path, data, tiny_model_dir, dropout=0.1)
    resumed = _weights(tmp_path / "model")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)
    assert f"resumed from {tmp_path / 'state' / 'step-1'}" in caplog.text
    assert "micro-batches above" in caplog.text and "out of memory in" not in caplog.text


def test_a_question_that_never_fits_ends_in_one_error_and_keeps_the_last_checkpoint(
    tmp_path, data, tiny_model_dir, tokenizer, monkeypatch, capsys
):
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({**READER, "max_steps": 4}))
    state = tmp_path / "state"
    args = ["train-reader", "--config", str(config), "--train", str(data[0]), "--dev",
            str(data[1]), "--init-model", str(tiny_model_dir), "--output",
            str(tmp_path / "model"), "--state-dir", str(state)]  # fmt: skip
    monkeypatch.setenv(INJECT_OOM, "3:10")  # step 3 on: not one question fits
    assert main(args) == 1
    err = capsys.readouterr().err
    found = re.search(r"step 3: question '([^']+)' \((\d+) tokens\) alone ran out of memory at "
                      r"a micro-batch token limit of (\d+); the last checkpoint is kept", err)  # fmt: skip
    assert found, err[-3000:]
    assert "Traceback" not in err and "bug in fid" not in err
    examples = {e.id: e for e in load_examples(data[0])}
    collator = ReaderCollator(tokenizer, n_passages=3, passage_max_tokens=32)
    question, tokens = found.group(1), int(found.group(2))
    assert [tokens] == collator.question_token_counts([examples[question]])
    assert tokens > 10 and int(found.group(3)) <= tokens
    # step 2's checkpoint is the last, whole (its manifest verifies), with no half-written one
    assert os.readlink(state / "latest") == "step-2"
    assert sorted(p.name for p in state.iterdir() if p.name.startswith(("step-", "."))) == [
        "step-1",
        "step-2",
    ]
    verify_checkpoint(state / "step-2")
    assert not (tmp_path / "model").exists()
    monkeypatch.delenv(INJECT_OOM)  # the cause gone, the same command resumes from step 2
    assert main(args) == 0
    assert "resuming" in capsys.readouterr().err


def test_the_retriever_recovers_as_the_unsplit_step(tmp_path, toy_records, monkeypatch):
    train, dev, bert = scored_retriever_inputs(tmp_path, toy_records, 16, 4, 3)
    config = tmp_path / "retriever.yaml"
    config.write_text(yaml.safe_dump(dict(
        batch_size_per_device=4, max_steps=2, lr=1e-3, warmup_steps=1, eval_every_steps=2,
        save_every_steps=1, keep_last_checkpoints=2, log_every_steps=1, precision="fp32",
        tensorboard=False, n_passages=3, passage_max_tokens=32, question_max_tokens=16,
        eval_k=[1, 2], select_on="candidate_agreement@1",
    )))  # fmt: skip

    def run(name: str) -> Path:
        state = tmp_path / name
        assert main(["train-retriever", "--config", str(config), "--train", str(train), "--dev",
                     str(dev), "--init-model", str(bert), "--output", str(tmp_path / f"m-{name}"),
                     "--state-dir", str(state)]) == 0  # fmt: skip
        return state / "step-2"

    plain = run("plain")
    # one question and its 3 passages hold at most 16 + 3 x 32 = 112 tokens
    monkeypatch.setenv(INJECT_OOM, "2:112")
    oom = run("oom")
    assert _limit(plain) is None and _limit(oom) is not None
    _assert_close(_weights(oom), _weights(plain), 1e-6)


def test_retriever_micro_batches_with_in_batch_negatives_are_not_split():
    task = SimpleNamespace(cfg=SimpleNamespace(in_batch_negatives=True))
    assert RetrieverTask.split(task, [3, 1, 2]) == [[3, 1, 2]]


class _Questions:
    """A task whose micro-batches are lists of token counts."""

    def item_tokens(self, item):
        return sum(item)

    def split(self, item):
        if len(item) < 2:
            return [item]
        cut = halve(item)
        return [item[:cut], item[cut:]]

    def question_ids(self, item):
        return [f"q{n}" for n in item]


def test_micro_batches_are_halved_by_tokens_until_within_the_limit():
    assert halve([1, 1, 1, 1]) == 2 and halve([9, 1, 1, 1]) == 1 and halve([1, 1, 9]) == 2
    task = _Questions()
    assert fit(task, [[5, 5, 5, 5], [3]], None) == [[5, 5, 5, 5], [3]]
    assert fit(task, [[5, 5, 5, 5], [3]], 10) == [[5, 5], [5, 5], [3]]
    assert fit(task, [[5, 5, 5, 5], [30]], 9) == [[5], [5], [5], [5], [30]]  # one stays whole


def test_a_redone_step_draws_the_random_numbers_of_its_first_attempt():
    """The RNG states go back to the step's start: dropout masks of the redo are the first
    attempt's (the split then decides which rows each piece takes)."""
    progress = TrainingProgress()
    parameter = torch.nn.Parameter(torch.zeros(2))
    draws = []

    def accumulate(task, pieces):
        draws.append(torch.rand(3))
        parameter.grad = torch.ones(2)
        for piece in pieces:
            task.loss(None, piece)
        return torch.tensor(1.0)

    class Failing(_Questions):
        def loss(self, model, item):
            if len(item) > 1:
                raise torch.OutOfMemoryError("simulated")

    recovery = StepRecovery(Failing(), progress, CPU, recoverable=True)
    recovery.run(7, [[4, 4]], accumulate, [parameter])
    assert len(draws) == 2 and torch.equal(draws[0], draws[1])
    assert progress.micro_batch_token_limit == 4


@pytest.mark.parametrize("value", ["x", "0:5", "1", "1:2:3:4", "1:-1"])
def test_a_malformed_injection_is_refused(value):
    with pytest.raises(ConfigError, match=INJECT_OOM):
        Injection.from_env(0, {INJECT_OOM: value})
    assert Injection.from_env(0, {INJECT_OOM: "2:5:1"}) is None  # another rank's
    assert Injection.from_env(1, {INJECT_OOM: "2:5:1"}) == Injection(2, 5)


def _launch(args: list, env: dict, cwd: Path, timeout: float) -> list[str]:
    """`python -m fid ARGS` as 2 gloo ranks (test_distributed's launcher, but every rank is
    killed if the run does not end in `timeout` seconds: a hang fails the test, no more)."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "fid", "--threads", "1", *map(str, args)],
            env=dict(
                os.environ,
                **env,
                RANK=str(rank),
                WORLD_SIZE="2",
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                OMP_NUM_THREADS="1",
            ),
            cwd=cwd,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in range(2)
    ]
    try:
        logs = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"
    return logs


@pytest.mark.slow
def test_two_ranks_redo_the_step_together_when_one_runs_out_of_memory(
    tmp_path, data, tiny_model_dir
):
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({**READER, "batch_size_per_device": 2, "max_steps": 2}))

    def run(name: str, env: dict) -> list[str]:
        return _launch(["train-reader", "--config", config, "--train", data[0], "--dev", data[1],
                        "--init-model", tiny_model_dir, "--output", tmp_path / f"m-{name}",
                        "--state-dir", tmp_path / name], env, tmp_path, timeout=240)  # fmt: skip

    run("plain", {})
    logs = run("oom", {INJECT_OOM: f"2:{FITS_ONE_QUESTION}:1"})  # rank 1's step 2
    assert "step 2: out of memory in a micro-batch" in logs[0] + logs[1]
    assert "(rank 1)" in logs[0] + logs[1]
    plain, oom = tmp_path / "plain" / "step-2", tmp_path / "oom" / "step-2"
    assert _limit(plain) is None and _limit(oom) is not None
    _assert_close(_weights(oom), _weights(plain), 1e-6)


def test_a_retriever_with_a_new_projection_head_starts_from_the_same_weights(
    tmp_path, toy_records, monkeypatch
):
    """The projection head new to the start model is drawn from torch's global generator,
    which the run seeded only later, for dropout: the same seed gave other start weights each
    time, so a run stopped before its first checkpoint restarted from other ones (review of
    issue 43). Seeded before it is built: two runs end bitwise equal, whatever came before."""
    train, dev, bert = scored_retriever_inputs(tmp_path, toy_records, 16, 4, 3)
    config = tmp_path / "retriever.yaml"
    config.write_text(yaml.safe_dump(dict(
        batch_size_per_device=4, max_steps=1, lr=1e-3, warmup_steps=1, eval_every_steps=1,
        save_every_steps=1, log_every_steps=1, precision="fp32", tensorboard=False,
        n_passages=3, passage_max_tokens=32, question_max_tokens=16, eval_k=[1],
        select_on="candidate_agreement@1", projection_dim=8,
    )))  # fmt: skip

    def run(name: str, noise_seed: int) -> dict:
        torch.manual_seed(noise_seed)  # whatever the process drew before
        assert main(["train-retriever", "--config", str(config), "--train", str(train), "--dev",
                     str(dev), "--init-model", str(bert), "--output", str(tmp_path / f"m-{name}"),
                     "--state-dir", str(tmp_path / name)]) == 0  # fmt: skip
        return _weights(tmp_path / name / "step-1")

    first, second = run("first", 1), run("second", 2)
    assert any("proj" in name for name in first), sorted(first)
    _assert_close(second, first, 0.0)
