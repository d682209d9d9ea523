"""Distributed runs: the launcher's environment, DDP equivalence, lossless sharding, preemption.

Multi-process tests start real `fid` processes (gloo, one thread each) with torchrun's
variables, as a launcher would.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import scored_retriever_inputs, write_json
from safetensors.torch import load_file

from fid.runtime.distributed import DistInfo, DistributedError, init_from_env, slurm_port

ROOT = Path(__file__).resolve().parents[1]


def test_single_process_by_default():
    assert init_from_env({}) == DistInfo()


def test_torchrun_variables():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n1",
           "MASTER_PORT": "1234", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}  # fmt: skip
    assert init_from_env(env) == DistInfo(3, 1, 4, "n1", 1234, "torchrun")


def test_slurm_variables_first_node_is_master():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_STEP_NODELIST": "gpu[07-10],cpu1", "SLURM_JOB_NODELIST": "other",
           "SLURM_JOB_ID": "123456"}  # fmt: skip
    info = init_from_env(env)
    assert (info.rank, info.local_rank, info.world_size) == (5, 1, 8)
    assert info.master_addr == "gpu07" and info.launcher == "slurm"
    assert info.master_port == 10000 + 123456 % 22768
    assert init_from_env({**env, "FID_MASTER_PORT": "4000"}).master_port == 4000


def test_a_jobs_port_lies_below_the_ephemeral_range():
    """Ports derived from job ids spread over 10000-32767: below Linux's ephemeral range
    (32768-60999), which outgoing connections take from; 15000-34999 overlapped it (issue
    45.6). Consecutive jobs get distinct ports."""
    ports = [slurm_port({"SLURM_JOB_ID": str(job)}) for job in range(0, 200000, 7)]
    assert min(ports) >= 10000 and max(ports) <= 32767
    assert len({slurm_port({"SLURM_JOB_ID": str(job)}) for job in range(1000, 1100)}) == 100


@pytest.mark.parametrize(
    "env, message",
    [
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "a", "WORLD_SIZE": "2"},
         "WORLD_SIZE=2 does not match SLURM_NTASKS=4"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "rank 4 is not within a world of 4"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, "RANK='x' is not an integer"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "names the nodes"),
    ],
)  # fmt: skip
def test_inconsistent_environments(env, message):
    with pytest.raises(DistributedError, match=message):
        init_from_env(env)


def test_each_rank_takes_its_own_gpu_or_the_cpu():
    """Two ranks on one GPU stop NCCL at the first collective ("Duplicate GPU detected"): a
    local rank without a GPU of its own is an error naming the fix, not a modulo. A rank that
    sees exactly one GPU (CUDA_VISIBLE_DEVICES set per task: srun --gpus-per-task=1) takes it,
    whatever its local rank; ranks that turn out to share one are refused once the group is up.
    """
    from fid.runtime.distributed import check_distinct_gpus, rank_device

    assert rank_device(0, 0) == rank_device(3, 0) == torch.device("cpu")
    assert rank_device(1, 2) == torch.device("cuda", 1)
    assert rank_device(1, 1) == rank_device(7, 1) == torch.device("cuda", 0)
    with pytest.raises(DistributedError, match="local rank 2 but this node shows 2 GPU"):
        rank_device(2, 2)
    # one GPU each, by task: the same index 0 everywhere, distinct GPUs
    check_distinct_gpus([("n1", "GPU-a"), ("n1", "GPU-b"), ("n2", "GPU-a"), ("n2", "GPU-b")])
    with pytest.raises(DistributedError, match="ranks 0 and 1 share GPU GPU-a on n1"):
        check_distinct_gpus([("n1", "GPU-a"), ("n1", "GPU-a")])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list, world_size: int, cwd: Path, timeout: int = 300) -> list[str]:
    """Runs `python -m fid ARGS` as `world_size` gloo ranks; returns each rank's stderr."""
    port = str(_free_port())
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "fid", "--threads", "1", *map(str, args)],
            env=env, cwd=cwd, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    logs = [p.communicate(timeout=timeout)[1] for p in procs]
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"
    return logs


def _yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def equal_length_data(tmp_path, toy_records):
    """Targets of equal token length: per-rank mean losses then average to the global mean."""
    train = [dict(r, target="x y") for r in toy_records["train"][:16]]
    return write_json(tmp_path / "train.json", train), write_json(
        tmp_path / "dev.json", toy_records["dev"][:5]
    )


def _reader_config(tmp_path, batch):
    return _yaml(tmp_path / f"train{batch}.yaml", dict(
        n_passages=3, passage_max_tokens=32, batch_size_per_device=batch, max_steps=4,
        lr=1e-3, warmup_steps=1, eval_every_steps=2, save_every_steps=2, log_every_steps=1,
        eval_batch_size=2, max_new_tokens=3, precision="fp32", tensorboard=False, dropout=0.0,
    ))  # fmt: skip


@pytest.mark.slow
def test_two_ranks_equal_one_process_with_twice_the_batch(
    tmp_path, tiny_model_dir, equal_length_data
):
    train, dev = equal_length_data
    for world, batch in ((1, 4), (2, 2)):
        launch(["train-reader", "--config", _reader_config(tmp_path, batch), "--train", train,
                "--dev", dev, "--init-model", tiny_model_dir, "--output", tmp_path / f"m{world}",
                "--state-dir", tmp_path / f"s{world}"], world, tmp_path)  # fmt: skip
    one, two = (
        load_file(tmp_path / "m1/model.safetensors"),
        load_file(tmp_path / "m2/model.safetensors"),
    )
    for name in one:
        torch.testing.assert_close(one[name], two[name], atol=1e-5, rtol=1e-4, msg=name)
    dev_one = [json.loads(x) for x in (tmp_path / "m1/metrics.jsonl").read_text().splitlines()]
    dev_two = [json.loads(x) for x in (tmp_path / "m2/metrics.jsonl").read_text().splitlines()]
    assert [d["n"] for d in dev_one if d["kind"] == "dev"] == [5, 5]  # the whole dev set
    assert [d["exact_match"] for d in dev_one if d["kind"] == "dev"] == [
        d["exact_match"] for d in dev_two if d["kind"] == "dev"
    ]
    # every rank's own peak, in rank order, rank 0's the line's peak (issue 45.5: the report
    # showed the srun client's RSS as the ranks')
    for world, lines in ((1, dev_one), (2, dev_two)):
        for line in (d for d in lines if d["kind"] == "train"):
            assert len(line["rank_peaks_mb"]) == world and min(line["rank_peaks_mb"]) > 0, line
            assert line["rank_peaks_mb"][0] == round(line["peak_memory_mb"], 1), line


@pytest.mark.slow
def test_retriever_two_ranks_equal_one_process(tmp_path, toy_records):
    train, dev, bert = scored_retriever_inputs(tmp_path, toy_records, 8, 5, 4)
    for world, batch in ((1, 4), (2, 2)):
        config = _yaml(tmp_path / f"r{world}.yaml", dict(
            batch_size_per_device=batch, max_steps=3, lr=1e-3, warmup_steps=1, eval_every_steps=3,
            log_every_steps=1, precision="fp32", tensorboard=False, n_passages=4,
            passage_max_tokens=32, question_max_tokens=16, eval_k=[1, 2], select_on="candidate_agreement@1",
        ))  # fmt: skip
        launch(["train-retriever", "--config", config, "--train", train, "--dev", dev,
                "--init-model", bert, "--output", tmp_path / f"m{world}",
                "--state-dir", tmp_path / f"s{world}"], world, tmp_path)  # fmt: skip
    one = load_file(tmp_path / "m1/question_encoder/model.safetensors")
    two = load_file(tmp_path / "m2/question_encoder/model.safetensors")
    for name in one:
        torch.testing.assert_close(one[name], two[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_eval_and_scoring_lose_nothing_on_1_2_3_ranks(tmp_path, tiny_model_dir, toy_records):
    questions = write_json(tmp_path / "q.json", toy_records["dev"][:7])  # 7: not divisible by 2, 3
    config = _yaml(
        tmp_path / "c.yaml", {"n_passages": 3, "max_new_tokens": 3, "eval_batch_size": 2}
    )
    score_config = _yaml(tmp_path / "s.yaml", {"n_passages": 3, "batch_size": 2})
    outputs = {}
    for world in (1, 2, 3):
        launch(["eval-reader", "--config", config, "--model", tiny_model_dir, "--questions",
                questions, "--predictions", tmp_path / f"p{world}.jsonl", "--metrics",
                tmp_path / f"m{world}.json"], world, tmp_path)  # fmt: skip
        launch(["score-passages", "--config", score_config, "--model", tiny_model_dir, "--questions",
                questions, "--output", tmp_path / f"s{world}.json"], world, tmp_path)  # fmt: skip
        metrics = json.loads((tmp_path / f"m{world}.json").read_text())
        assert metrics.pop("generation")["questions_per_second"] > 0  # speed: not a result
        outputs[world] = (
            (tmp_path / f"p{world}.jsonl").read_text(),
            metrics,
            json.loads((tmp_path / f"s{world}.json").read_text()),
        )
    assert len(outputs[1][0].splitlines()) == 7 and outputs[1][1]["n_scored"] == 7
    for world in (2, 3):
        assert outputs[world][0] == outputs[1][0]
        assert outputs[world][1] == outputs[1][1]
        for a, b in zip(outputs[world][2], outputs[1][2], strict=True):
            assert [c["reader_score"] for c in a["ctxs"]] == pytest.approx(
                [c["reader_score"] for c in b["ctxs"]], abs=1e-5, nan_ok=True
            )


def _wait_for_progress(log: Path, offset: int, lines: int, process, timeout: float = 300) -> None:
    """Returns once `log` holds `lines` progress lines ("step N/M loss") past byte `offset`,
    or the process has ended."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if log.exists():
            with log.open("rb") as file:
                file.seek(offset)
                if len(re.findall(rb"step \d+/\d+ loss", file.read())) >= lines:
                    return
        time.sleep(0.05)


def _train_args(tmp_path, model_dir, train, dev, name, config):
    return [sys.executable, "-m", "fid", "--threads", "1", "train-reader", "--config", str(config),
            "--train", str(train), "--dev", str(dev), "--init-model", str(model_dir),
            "--output", str(tmp_path / f"model-{name}"), "--state-dir", str(tmp_path / f"state-{name}")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("how", ["signals", "sigkill"])
def test_interrupted_runs_end_bitwise_equal(tmp_path, tiny_model_dir, toy_records, how):
    """SIGUSR1/SIGTERM at random steps (a clean stop with a checkpoint), or SIGKILL at random
    moments of a run that checkpoints every step (a kill mid-write included): resumed to the
    end, the weights equal those of an uninterrupted run, bit for bit."""
    train = write_json(tmp_path / "train.json", toy_records["train"][:40])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:3])
    config = _yaml(tmp_path / "c.yaml", dict(
        n_passages=3, passage_max_tokens=32, batch_size_per_device=4, max_steps=120, lr=1e-3,
        warmup_steps=5, eval_every_steps=60, save_every_steps=1 if how == "sigkill" else 1000,
        keep_last_checkpoints=2, log_every_steps=10, eval_batch_size=3, max_new_tokens=3,
        precision="fp32", tensorboard=False, dropout=0.1,
    ))  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    straight = subprocess.run(_train_args(tmp_path, tiny_model_dir, train, dev, "straight", config),
                              env=env, capture_output=True, text=True)  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-2000:]

    rng = random.Random(0)
    interruptions, signals = 0, [signal.SIGUSR1, signal.SIGTERM]
    train_log = tmp_path / "state-stopped" / "train.log"
    for attempt in range(12):
        logged = train_log.stat().st_size if train_log.exists() else 0
        process = subprocess.Popen(_train_args(tmp_path, tiny_model_dir, train, dev, "stopped", config),
                                   env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
        if attempt < 4:
            # Interrupt the first runs at a random moment once they train: after 1-3 progress
            # lines (10 steps each) of this start, plus up to ~10 steps more. Counted in steps,
            # not seconds, so that at least two runs are interrupted however fast the machine.
            _wait_for_progress(train_log, logged, rng.randint(1, 3), process)
            time.sleep(rng.uniform(0.0, 0.5))
            if process.poll() is None:
                sig = signal.SIGKILL if how == "sigkill" else signals[attempt % 2]
                process.send_signal(sig)
                interruptions += 1
        _, log = process.communicate(timeout=300)
        if process.returncode == 0:
            break
        expected = -signal.SIGKILL if how == "sigkill" else 75
        assert process.returncode == expected, log[-2000:]
        if how == "signals":
            assert "stopping at step" in log
    assert process.returncode == 0 and interruptions >= 2
    a = load_file(tmp_path / "model-straight/model.safetensors")
    b = load_file(tmp_path / "model-stopped/model.safetensors")
    for name in a:
        assert torch.equal(a[name], b[name]), name


# `fid` with a signal sent to itself at a chosen moment: during start-up (before the loop),
# while the finished model is exported (after the last step, when the loop's own record of
# signals is gone), or while the interpreter shuts down after `main` returned (Python has then
# reset the handlers it installed to the default action, death). Without the command-wide
# record, or without ignoring the signals once the run is over, each kills the process (-10).
_SIGNAL_AT = """
import os, signal, sys
import fid.training.runs as runs
name = sys.argv.pop(1)
if name == "interpreter_exit":
    class SignalWhenCollected:  # collected with __main__'s globals, late in the shutdown
        def __del__(self, kill=os.kill, pid=os.getpid(), number=signal.SIGUSR1):
            kill(pid, number)
    late = SignalWhenCollected()
else:
    original = getattr(runs, name)
    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGUSR1)
        return original(*args, **kwargs)
    setattr(runs, name, signalled)
from fid.cli import command
command()
"""


@pytest.mark.parametrize("moment", ["run_training", "export_best_model", "interpreter_exit"])
def test_a_signal_outside_the_loop_is_no_kill(tmp_path, tiny_model_dir, toy_records, moment):
    train = write_json(tmp_path / "train.json", toy_records["train"][:8])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:2])
    config = _yaml(tmp_path / "c.yaml", dict(
        n_passages=2, passage_max_tokens=16, batch_size_per_device=2, max_steps=3,
        eval_every_steps=0, save_every_steps=0, log_every_steps=1, eval_batch_size=2,
        max_new_tokens=3, tensorboard=False,
    ))  # fmt: skip
    args = _train_args(tmp_path, tiny_model_dir, train, dev, "run", config)[3:]  # after -m fid
    command = [sys.executable, "-c", _SIGNAL_AT, moment, *args]
    first = subprocess.run(command, capture_output=True, text=True)
    state = tmp_path / "state-run"
    if moment == "run_training":
        # recorded during start-up: the loop stops after its first step, with a checkpoint
        assert first.returncode == 75, first.stderr[-2000:]
        assert "stopping at step 1 on a signal" in first.stderr
        assert (state / "step-1").is_dir() and not (tmp_path / "model-run").exists()
        again = subprocess.run(_train_args(tmp_path, tiny_model_dir, train, dev, "run", config),
                               capture_output=True, text=True)  # fmt: skip
        assert again.returncode == 0 and "resumed from" in again.stderr, again.stderr[-2000:]
    else:
        # the work is done when it arrives: exported, and a clean exit
        assert first.returncode == 0, first.stderr[-2000:]
    assert (tmp_path / "model-run" / "model.safetensors").is_file()


@pytest.mark.slow
def test_fsdp_matches_ddp_and_resumes_from_sharded_checkpoints(
    tmp_path, tiny_model_dir, equal_length_data
):
    import shutil

    train, dev = equal_length_data
    base = yaml.safe_load(_reader_config(tmp_path, 2).read_text())
    for name in ("ddp", "fsdp"):
        config = _yaml(tmp_path / f"{name}.yaml", dict(base, sharding=name))
        launch(["train-reader", "--config", config, "--train", train, "--dev", dev,
                "--init-model", tiny_model_dir, "--output", tmp_path / f"m-{name}",
                "--state-dir", tmp_path / f"s-{name}"], 2, tmp_path)  # fmt: skip
    ddp = load_file(tmp_path / "m-ddp/model.safetensors")
    fsdp = load_file(tmp_path / "m-fsdp/model.safetensors")
    for name in ddp:
        torch.testing.assert_close(ddp[name], fsdp[name], atol=1e-5, rtol=1e-4, msg=name)
    state = tmp_path / "s-fsdp"
    assert (state / "step-4" / "sharded" / ".metadata").is_file()
    assert not (state / "step-4" / "model.safetensors").exists()

    # Lose the last checkpoint and the model: the rerun resumes from the sharded step-2.
    shutil.rmtree(state / "step-4")
    shutil.rmtree(tmp_path / "m-fsdp")
    (state / "finished.json").unlink()  # as if it never got as far as its export
    logs = launch(["train-reader", "--config", tmp_path / "fsdp.yaml", "--train", train,
                   "--dev", dev, "--init-model", tiny_model_dir, "--output", tmp_path / "m-fsdp",
                   "--state-dir", state], 2, tmp_path)  # fmt: skip
    assert "resumed from" in logs[0] and "step-2" in logs[0]
    resumed = load_file(tmp_path / "m-fsdp/model.safetensors")
    for name in fsdp:
        assert torch.equal(fsdp[name], resumed[name]), name


_GATHER = """
import json, sys
from fid.runtime import distributed
info = distributed.init_from_env()
distributed.setup(info)
n = 7
mine = distributed.shard_indices(n)
gathered = distributed.gather_to_main(n, [{"q": i, "score": i / 10} for i in mine])
print(json.dumps({"rank": info.rank, "mine": mine, "gathered": gathered}))
distributed.cleanup()
"""


def test_scores_are_gathered_to_rank_0_only(tmp_path):
    """gather_to_main: rank 0 gets every rank's share in input order, the others nothing."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _GATHER],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(
                os.environ,
                RANK=str(r),
                WORLD_SIZE="2",
                LOCAL_RANK=str(r),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                OMP_NUM_THREADS="1",
            ),
        )  # fmt: skip
        for r in range(2)
    ]
    outputs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    by_rank = {o["rank"]: o for o in outputs}
    assert by_rank[0]["mine"] == [0, 2, 4, 6] and by_rank[1]["mine"] == [1, 3, 5]
    assert by_rank[0]["gathered"] == [{"q": i, "score": i / 10} for i in range(7)]
    assert by_rank[1]["gathered"] is None


@pytest.mark.slow
def test_compact_lists_scored_on_2_ranks_equal_fid_json_in_one_process(
    tmp_path, tiny_model_dir, toy_records, toy_world
):
    from test_retrieval_lists import _write_tsv

    from fid.data.list_conversion import convert_lists
    from fid.data.passage_store import build_passage_store

    build_passage_store(_write_tsv(tmp_path / "p.tsv", toy_world.passages), tmp_path / "store")
    questions = write_json(tmp_path / "q.json", toy_records["dev"][:5])
    convert_lists(questions, tmp_path / "store", tmp_path / "q.jsonl")
    config = _yaml(tmp_path / "s.yaml", {"n_passages": 3, "batch_size": 2})
    common = ["score-passages", "--config", config, "--model", tiny_model_dir]
    launch([*common, "--questions", questions, "--output", tmp_path / "one.json"], 1, tmp_path)
    launch([*common, "--questions", tmp_path / "q.jsonl", "--output", tmp_path / "two.jsonl",
            "--passages", tmp_path / "store"], 2, tmp_path)  # fmt: skip
    convert_lists(tmp_path / "two.jsonl", tmp_path / "store", tmp_path / "two.json")
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert [r["id"] for r in two] == [r["id"] for r in one]
    for a, b in zip(one, two, strict=True):
        assert [c["reader_score"] for c in b["ctxs"]] == pytest.approx(
            [c["reader_score"] for c in a["ctxs"]], abs=1e-5, nan_ok=True
        )


def test_collectives_wait_past_a_long_checkpoint_write_and_the_wait_is_configurable(monkeypatch):
    """The ranks wait in a barrier while rank 0 alone writes, checksums or exports tens of GB
    (t5-3b, t5-11b on a shared file system): at the old 600 s the waiting ranks were aborted
    and every rerun failed at the same export (review of issue 43). 30 minutes by default,
    FID_COLLECTIVE_TIMEOUT_S otherwise, a bad value one clear error."""
    from fid.runtime.distributed import DistributedError, collective_timeout_s

    monkeypatch.delenv("FID_COLLECTIVE_TIMEOUT_S", raising=False)
    assert collective_timeout_s() == 1800
    monkeypatch.setenv("FID_COLLECTIVE_TIMEOUT_S", "7200")
    assert collective_timeout_s() == 7200
    for bad in ("0", "ten", "-5", "1.5"):
        monkeypatch.setenv("FID_COLLECTIVE_TIMEOUT_S", bad)
        with pytest.raises(DistributedError, match="FID_COLLECTIVE_TIMEOUT_S"):
            collective_timeout_s()
