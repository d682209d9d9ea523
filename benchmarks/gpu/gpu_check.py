"""The GPU path's acceptance run: every path that only a GPU takes, executed once and compared
with the CPU, in one call (issue 21; <= 8 minutes on one GPU).

    python benchmarks/gpu/gpu_check.py                       # on a CUDA machine: the full run
    python benchmarks/gpu/gpu_check.py --device cpu --small  # the same steps, small, on a CPU

Each check prints one row (ok, seconds, what it found) and everything goes to OUT/gpu_check.json
(benchmarks/harness.py's record: machine, versions and commit, the checks under "results");
the exit status is 1 if any check failed (a check fails by raising CheckFailed through `require`,
never by assert, so that `python -O` runs every check too). The checks, on a demo world with
tiny models:

- train fp16 / bf16: reader training with autocast (fp16 with the loss scaler, CUDA only); its
  first losses are finite and within a tolerance of the fp32 CPU run on the same seed and data,
  no step skipped beyond the loss scaler's first calibration steps (fp16; none in bf16), its
  gradient norms finite after them, and its weights changed from the start model's;
- resume: fp32 training stopped by SIGUSR1 after its first checkpoint (exit 75) and run again
  ends bitwise equal to an uninterrupted run (`deterministic: true`);
- eval / score / embed / retrieve: `eval-reader`, `score-passages`, `embed-passages`, `retrieve`
  on the device equal the CPU's (fp32: the same answers; scores, vectors and lists within
  tolerance);
- process group: `torchrun` with 2 ranks (gloo on a CPU; NCCL where 2+ GPUs are visible; one
  rank on a one-GPU machine, as the workflow runs it there) through fid's collectives, and the
  FSDP reader built sharded, through a training step and its export;
- train retriever: distillation on the device, its loss finite and close to the CPU's;
- acceleration speed: benchmarks/reader/reader_acceleration.py speed on the device (issue 14's table);
- MFU: a reader training step at t5-base shape (small: tiny), N = 100 passages of 250 tokens,
  bf16, its model FLOPs per second against the chip's bf16 dense peak (goal >= 40%), and the
  step's kernels by time (mfu_profile.txt);
- memory plan: benchmarks/memory/memory_plan.py --quick on the device, `fid plan-memory`'s predicted
  peak against max_memory_allocated (goal 10%; small: one case, no goal).
- out of memory: a real one (issue 28 item 4). CUDA's caching allocator is capped
  (torch.cuda.set_per_process_memory_fraction) halfway between the measured peaks of a
  micro-batch and of its half (each the whole process's peak, kept across the resets of the
  training log's intervals): reader training must redo the step split, lower its token
  limit and end with the uncapped run's parameters (fp32 round-off); score-passages must
  split its batch, lower its batch size and write the uncapped run's scores. On a CPU the
  same commands run under FID_INJECT_OOM (the tests' simulated error) instead of a cap.

`--device cpu --small` runs every check that a CPU can (fp16 and the MFU's peak are CUDA's) on
tiny sizes in 3-4 minutes on 2 cores: tests/test_gpu_check.py runs it, so that the script cannot
rot before a GPU runs it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.harness` however this file is run (or imported)

from benchmarks.harness import record, timed, write_record  # noqa: E402

# bf16 dense peak FLOP/s by GPU name (NVIDIA's data sheets, without sparsity)
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
TOLERANCE = {"fp16": 0.02, "bf16": 0.05, "fp32": 1e-4}  # relative, first logged losses
# fp16's loss scaler (torch.amp.GradScaler) starts at a scale of 2**16 and halves it on each
# step that overflows, skipping that step: its first steps may be skipped while it looks for a
# scale that fits the gradients. 2**16 halved 5 times leaves room for scaled values up to 32 in
# fp16's range (65504), far above a tiny reader's gradients; more skips, or a skip once the
# scaler has settled, are fp16 overflowing the model itself (a run that could "train" without
# a single update for up to max_skipped_steps_in_a_row = 25 steps). bf16 and fp32 have no
# scaler: none of their steps may be skipped.
SCALER_CALIBRATION_STEPS = 5


class CheckFailed(Exception):
    """A check found its path wrong (raised by `require`)."""


def require(condition: object, message: str) -> None:
    """Fails the check with `message` unless `condition` holds: an explicit raise, not an
    assert, which `python -O` would remove (and with it the check)."""
    if not condition:
        raise CheckFailed(message)


def _fid(*args, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m fid ARGS` (one thread), its output captured."""
    command = [sys.executable, "-m", "fid", "--threads", "1", *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, **(env or {})})  # fmt: skip
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[2:6])}...: exit {result.returncode}\n"
                           f"{result.stderr[-2000:]}")  # fmt: skip
    return result


def _child_error(stderr: str) -> str:
    """A failed child's own traceback: torchrun appends a long trailer (the script's text, its
    exit record) that would push the traceback out of a tail of the output."""
    start = stderr.find("Traceback (most recent call last)")
    return stderr[start : start + 3000] if start >= 0 else stderr[-3000:]


def _script(body: str) -> str:
    """A child script (run as `python -c`, a program of its own): BODY, after a line that lets
    it import this file (`require`, a check that fails under `python -O` too; ProcessPeak)."""
    return f"import sys\nsys.path.append({str(Path(__file__).resolve().parent)!r})\n{body}"


def _yaml(path: Path, values: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(values))
    return path


def _train_lines(model: Path) -> list[dict]:
    """The training lines of a run's metrics.jsonl (fid/training/interval_log.py: step, loss,
    skipped_steps, grad_norm, ...), one per log interval."""
    lines = (model / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def _losses(model: Path) -> list[float]:
    return [r["loss"] for r in _train_lines(model)]


def require_updates(precision: str, lines: list[dict]) -> str:
    """Fails unless a training log shows a run that trained: at most the loss scaler's first
    calibration steps skipped (fp16; none otherwise), and a finite gradient norm on every line
    after them (a skipped step's norm is not finite). Returns "N of M steps applied"."""
    calibration = SCALER_CALIBRATION_STEPS if precision == "fp16" else 0
    require(lines, f"{precision}: no training lines logged")
    steps = lines[-1]["step"]
    skipped = sum(line["skipped_steps"] for line in lines)
    require(skipped <= calibration and skipped < steps,
            f"{precision}: {skipped} of {steps} steps skipped (a loss scaler's calibration "
            f"explains at most {calibration})")  # fmt: skip
    unfinite = [(line["step"], line.get("grad_norm")) for line in lines
                if line["step"] > calibration and not _finite(line.get("grad_norm"))]  # fmt: skip
    require(not unfinite, f"{precision}: grad_norm not finite after step {calibration}: "
                          f"(step, grad_norm) {unfinite[:3]}")  # fmt: skip
    return f"{steps - skipped} of {steps} steps applied"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def changed_tensors(start: Path, trained: Path) -> tuple[int, int]:
    """(tensors whose values differ, tensors in both) between two model folders' weights."""
    from safetensors.torch import load_file

    before, after = (load_file(folder / "model.safetensors") for folder in (start, trained))
    common = sorted(before.keys() & after.keys())
    changed = sum(not before[name].float().equal(after[name].float()) for name in common)
    return changed, len(common)


class ProcessPeak:
    """The process's peak of CUDA memory allocated, kept across resets of CUDA's peak statistics.

    fid's training loop resets the peak at the start of the step after each logged line
    (fid/training/interval_log.py through PeakMemory.reset, fid/runtime/logs.py), so that
    each line reports its own interval: max_memory_allocated at exit is then the last
    interval's peak, not the run's. Wrapping the reset itself, so that each reset first keeps
    the peak so far, holds for every reset in the process (any log interval, any code path:
    evaluation, checkpoints, a future caller); the logged peaks would not (they leave out
    evaluation and saving, and score-passages logs none), nor would a log interval longer than
    the run (any other reset). `cuda` is torch.cuda (or a stand-in with the same names);
    install before importing the code that resets, which may hold the function otherwise."""

    def __init__(self, cuda):
        self.cuda, self.kept = cuda, 0
        reset = cuda.memory.reset_peak_memory_stats

        def keep_then_reset(device=None):
            self.kept = max(self.kept, cuda.max_memory_allocated(device))
            return reset(device)

        # torch.cuda's name and torch.cuda.memory's (reset_max_memory_allocated calls that one)
        cuda.reset_peak_memory_stats = cuda.memory.reset_peak_memory_stats = keep_then_reset

    def bytes(self) -> int:
        """The largest peak seen so far: before any reset, or since the last one."""
        return max(self.kept, self.cuda.max_memory_allocated())


class Run:
    """The shared set-up (a demo world, tiny models) and the checks, each a method."""

    def __init__(self, device: str, small: bool, out: Path):
        self.device, self.small, self.out = device, small, out
        self.cuda = device == "cuda"
        self.data = out / "data"
        # The CPU reference runs in a process that sees no GPU.
        self.cpu_env = {"CUDA_VISIBLE_DEVICES": ""}
        self.device_env = {} if self.cuda else self.cpu_env
        n_entities = 24 if small else 120
        _fid("make-demo-data", "--config", _yaml(out / "world.yaml", dict(
            n_entities=n_entities, n_dev_facts=16, n_test_facts=16, train_paraphrases=1,
            n_passages=4)), "--output", self.data)  # fmt: skip
        corpus = [self.data / "passages.tsv", self.data / "reader/train.json"]
        _fid("init-reader", "--config", _yaml(out / "init_reader.yaml", dict(
            vocab_size=500, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2,
            num_heads=4)), "--corpus", *corpus, "--output", out / "init_reader")  # fmt: skip
        _fid("init-retriever", "--config", _yaml(out / "init_retriever.yaml", dict(
            vocab_size=500, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)),
            "--corpus", *corpus, "--output", out / "init_retriever")  # fmt: skip

    def reader_config(self, name: str, **changes) -> Path:
        values = dict(n_passages=4, passage_max_tokens=64, batch_size_per_device=8,
                      max_steps=12, lr=1e-3, warmup_steps=2, eval_every_steps=12,
                      save_every_steps=4, log_every_steps=1, eval_batch_size=16,
                      max_new_tokens=6, dropout=0.0, tensorboard=False, precision="fp32")  # fmt: skip
        return _yaml(self.out / f"{name}.yaml", {**values, **changes})

    def train_reader(self, name: str, config: Path, env: dict, **flags) -> Path:
        _fid("train-reader", "--config", config, "--train", self.data / "reader/train.json",
             "--dev", self.data / "reader/dev.json", "--init-model", self.out / "init_reader",
             "--output", self.out / name, "--state-dir", self.out / f"state-{name}", env=env)  # fmt: skip
        return self.out / name

    # ---------------------------------------------------------------- checks
    def reference_reader(self) -> Path:
        """The fp32 reader trained on the CPU (once): the reference of the other checks."""
        model = self.out / "fp32-cpu"
        if not (model / "metrics.jsonl").is_file():
            self.train_reader("fp32-cpu", self.reader_config("fp32"), self.cpu_env)
        return model

    def train_precisions(self) -> str:
        reference = _losses(self.reference_reader())
        found = []
        for precision in ("fp16", "bf16") if self.cuda else ("bf16",):
            config = self.reader_config(precision, precision=precision)
            model = self.train_reader(precision, config, self.device_env)
            losses = _losses(model)
            first = losses[:3]
            require(all(x == x and abs(x) < 1e4 for x in losses), f"{precision}: {losses}")
            worst = max(abs(a - b) / abs(b) for a, b in zip(first, reference, strict=False))
            require(worst <= TOLERANCE[precision],
                    f"{precision}: first losses {first}, fp32 CPU's {reference[:3]}")  # fmt: skip
            # finite losses alone pass a run whose every step was skipped (fp16's overflows)
            applied = require_updates(precision, _train_lines(model))
            changed, tensors = changed_tensors(self.out / "init_reader", model)
            require(changed, f"{precision}: all {tensors} tensors equal the start model's")
            found.append(f"{precision} first losses within {worst:.1e} of fp32 CPU, {applied}")
        return "; ".join(found)

    def resume(self) -> str:
        from safetensors.torch import load_file

        config = self.reader_config("resume", max_steps=40, save_every_steps=5,
                                    eval_every_steps=40, deterministic=True)  # fmt: skip
        straight = self.train_reader("straight", config, self.device_env)
        state = self.out / "state-stopped"
        command = [sys.executable, "-m", "fid", "--threads", "1", "train-reader", "--config",
                   str(config), "--train", str(self.data / "reader/train.json"), "--dev",
                   str(self.data / "reader/dev.json"), "--init-model",
                   str(self.out / "init_reader"), "--output", str(self.out / "stopped"),
                   "--state-dir", str(state)]  # fmt: skip
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **self.device_env},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while not (state / "step-5").exists() and process.poll() is None:
            require(time.monotonic() < deadline, "no first checkpoint within 300 s")
            time.sleep(0.05)
        process.send_signal(signal.SIGUSR1)
        _, err = process.communicate(timeout=300)
        require(process.returncode == 75, f"exit {process.returncode}, not 75: {err[-1500:]}")
        subprocess.run(command, cwd=ROOT, env={**os.environ, **self.device_env}, check=True,
                       capture_output=True)  # fmt: skip
        one, two = (load_file(p / "model.safetensors") for p in (straight, self.out / "stopped"))
        differ = [name for name in one if not one[name].equal(two[name])]
        require(not differ, f"{len(differ)} tensors differ, e.g. {differ[:3]}")
        return f"stopped at a checkpoint (exit 75), resumed: {len(one)} tensors bitwise equal"

    def inference(self) -> str:
        import numpy as np

        reader = self.reference_reader()
        test = self.data / "reader/test.json"
        fp32 = _yaml(self.out / "eval.yaml", dict(n_passages=4, eval_batch_size=16,
                                                  max_new_tokens=6, precision="fp32"))  # fmt: skip
        found = {}
        for where, env in (("cpu", self.cpu_env), ("device", self.device_env)):
            _fid("eval-reader", "--config", fp32, "--model", reader, "--questions", test,
                 "--predictions", self.out / f"p-{where}.jsonl", "--metrics",
                 self.out / f"m-{where}.json", env=env)  # fmt: skip
            _fid("score-passages", "--config", _yaml(self.out / "score.yaml", dict(
                n_passages=4, precision="fp32")), "--model", reader, "--questions", test,
                "--output", self.out / f"scored-{where}.json", env=env)  # fmt: skip
            _fid("embed-passages", "--config", _yaml(self.out / "embed.yaml", dict(
                precision="fp32")), "--model", self.out / "init_retriever", "--passages",
                self.data / "passages.tsv", "--output", self.out / f"shard-{where}", env=env)  # fmt: skip
            _fid("build-index", "--shards", self.out / f"shard-{where}", "--output",
                 self.out / f"index-{where}", env=env)  # fmt: skip
            _fid("retrieve", "--config", _yaml(self.out / "retrieve.yaml", dict(
                top_k=10, precision="fp32")), "--model", self.out / "init_retriever",
                "--index", self.out / f"index-{where}", "--passages", self.data / "passages.tsv",
                "--questions", self.data / "test.jsonl", "--output",
                self.out / f"retrieved-{where}.json", env=env)  # fmt: skip
        answers = [[json.loads(x)["prediction"] for x in (self.out / f"p-{w}.jsonl").open()]
                   for w in ("cpu", "device")]  # fmt: skip
        require(answers[0] == answers[1], "eval-reader: other answers on the device")
        found["answers"] = f"{len(answers[0])} equal"
        scores = [[c["reader_score"] for r in json.loads((self.out / f"scored-{w}.json")
                   .read_text()) for c in r["ctxs"] if "reader_score" in c]
                  for w in ("cpu", "device")]  # fmt: skip
        worst = float(np.max(np.abs(np.array(scores[0]) - np.array(scores[1]))))
        require(worst <= 1e-4, f"score-passages: scores differ by {worst}")
        found["scores"] = f"max diff {worst:.1e}"
        vectors = [np.load(self.out / f"shard-{w}.npy").astype(np.float32)
                   for w in ("cpu", "device")]  # fmt: skip
        worst = float(np.abs(vectors[0] - vectors[1]).max())
        require(worst <= 2e-3, f"embed-passages: vectors differ by {worst}")  # float16 shards
        found["vectors"] = f"max diff {worst:.1e}"
        lists = [[[c["id"] for c in r["ctxs"]] for r in json.loads((self.out / f"retrieved-{w}"
                  ".json").read_text())] for w in ("cpu", "device")]  # fmt: skip
        same = np.mean([len(set(a) & set(b)) / len(a) for a, b in zip(*lists, strict=True)])
        require(same >= 0.99, f"retrieve: {same:.3f} of the top 10 shared")
        found["lists"] = f"{same:.1%} of the top 10 shared"
        return ", ".join(f"{k} {v}" for k, v in found.items())

    def process_group(self) -> str:
        # torchrun's variables; --no-python: it runs `python -c SCRIPT` as given. Two ranks
        # where each can have its own device (a CPU's gloo ranks, a machine with 2+ GPUs), so
        # that the reader is built sharded (each rank reading its own slices), trained and
        # exported by both; one rank on a one-GPU machine (the workflow's fit: one process).
        from fid.runtime.gpus import visible_gpus

        ranks = 2 if not self.cuda or visible_gpus() >= 2 else 1
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(ranks), "--log-dir", os.devnull, "--no-python",
                   sys.executable, "-c", _script(_PROCESS_GROUP),
                   str(self.out / "init_reader")]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                                env={**os.environ, **self.device_env})  # fmt: skip
        require(result.returncode == 0, _child_error(result.stderr))
        return result.stdout.strip().splitlines()[-1]

    def train_retriever(self) -> str:
        reader, losses = self.reference_reader(), {}
        score = _yaml(self.out / "score.yaml", dict(n_passages=4, precision="fp32"))
        for split in ("train", "dev"):
            _fid("score-passages", "--config", score, "--model", reader,
                 "--questions", self.data / f"reader/{split}.json", "--output",
                 self.out / f"scored-{split}.json", env=self.cpu_env)  # fmt: skip
        config = _yaml(self.out / "retriever.yaml", dict(
            n_passages=4, batch_size_per_device=8, max_steps=8, lr=1e-3, warmup_steps=1,
            eval_k=[1], select_on="candidate_agreement@1", eval_every_steps=8,
            save_every_steps=8, log_every_steps=1, precision="fp32", tensorboard=False))  # fmt: skip
        for where, env in (("cpu", self.cpu_env), ("device", self.device_env)):
            _fid("train-retriever", "--config", config, "--train", self.out / "scored-train.json",
                 "--dev", self.out / "scored-dev.json", "--init-model",
                 self.out / "init_retriever", "--output", self.out / f"retriever-{where}",
                 "--state-dir", self.out / f"state-retriever-{where}", env=env)  # fmt: skip
            losses[where] = _losses(self.out / f"retriever-{where}")
        require(all(x == x for x in losses["device"]), f"device losses {losses['device']}")
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses["device"][:3], losses["cpu"][:3],
                                                        strict=True))  # fmt: skip
        require(worst <= 1e-3, f"first losses {losses['device'][:3]}, CPU's {losses['cpu'][:3]}")
        return f"{len(losses['device'])} steps, first losses within {worst:.1e} of the CPU's"

    def acceleration_speed(self) -> str:
        sizes = ["--questions", "1", "--n", "2", "--steps", "2"] if self.small else \
            ["--questions", "32", "--n", "100", "--steps", "20", "--batch-size", "8"]  # fmt: skip
        options = ["plain", "prune k=1"] if self.small else []
        command = [sys.executable, "benchmarks/reader/reader_acceleration.py", "speed", *sizes,
                   "--device", self.device, *(["--options", *options] if options else [])]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900,
                                env={**os.environ, **self.device_env})  # fmt: skip
        require(result.returncode == 0, _child_error(result.stderr))
        (self.out / "acceleration_speed.txt").write_text(result.stdout)
        return f"table in {self.out / 'acceleration_speed.txt'}"

    def mfu(self) -> str:
        profile = self.out / "mfu_profile.txt"  # the step's kernels by time, for the next look
        result = subprocess.run([sys.executable, "-c", _MFU, self.device, str(self.small),
                                 str(profile)],
                                capture_output=True, text=True, cwd=ROOT, timeout=900,
                                env={**os.environ, **self.device_env})  # fmt: skip
        require(result.returncode == 0, _child_error(result.stderr))
        figures = json.loads(result.stdout.strip().splitlines()[-1])
        peak = next((v for k, v in PEAK_BF16.items() if k in figures["device_name"]), None)
        achieved = figures["flops"] / figures["step_s"]
        if peak is None:
            return f"{achieved / 1e12:.3f} TFLOP/s ({figures['device_name']}: no bf16 peak known)"
        mfu = achieved / peak
        require(mfu >= 0.40, f"MFU {mfu:.1%} < 40% ({achieved / 1e12:.1f} TFLOP/s)")
        return f"MFU {mfu:.1%}: {achieved / 1e12:.1f} of {peak / 1e12:.0f} TFLOP/s"

    def oom(self) -> str:
        return f"training: {self._oom_training()}; scoring: {self._oom_scoring()}"

    def _measured_fid(self, name: str, fraction: float, *args, env=None) -> tuple[int, str]:
        """(peak bytes allocated on the device, stderr) of `fid ARGS` under a memory cap."""
        peak = self.out / f"{name}.peak"
        script = _script(_MEASURED_FID)
        command = [sys.executable, "-c", script, str(fraction), str(peak), *map(str, args)]
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                                env={**os.environ, **self.device_env, **(env or {})})  # fmt: skip
        require(result.returncode == 0,
                f"{name}: exit {result.returncode}\n{result.stderr[-2000:]}")  # fmt: skip
        return int(peak.read_text()), result.stderr

    def _oom_reader(self) -> Path:
        """A reader whose activations outweigh its weights and the allocator's slack."""
        model = self.out / "init_reader_oom"
        if not (model / "config.json").is_file():
            d = 32 if self.small else 128
            _fid("init-reader", "--config", _yaml(self.out / "init_reader_oom.yaml", dict(
                vocab_size=500, d_model=d, d_ff=4 * d, d_kv=d // 4, num_layers=2,
                num_decoder_layers=2, num_heads=4)), "--corpus", self.data / "passages.tsv",
                self.data / "reader/train.json", "--output", model)  # fmt: skip
        return model

    def _split_run(self, run, batch: int, tokens_per_item: int) -> tuple[int, str, str]:
        """Runs `run(name, batch, fraction, env)` (-> (peak bytes, stderr)) uncapped as the
        reference, then at the same batch where a batch cannot fit but its half can: on CUDA
        with the allocator capped halfway between the batch's peak and its half's (the batch
        doubled until they differ by 64 MiB, more than the allocator's slack); on a CPU with
        FID_INJECT_OOM at 3/4 of a batch's tokens. Returns (batch, reference name, log)."""
        import torch

        if not self.cuda:
            run(f"full{batch}", batch)
            inject = {"FID_INJECT_OOM": f"1:{batch * tokens_per_item * 3 // 4}"}
            return batch, f"full{batch}", run("capped", batch, env=inject)[1]
        half = run(f"full{batch // 2}", batch // 2)[0]
        full = run(f"full{batch}", batch)[0]
        while full - half < 64 * 2**20 and batch < 1024:
            batch, half = 2 * batch, full
            full = run(f"full{batch}", batch)[0]
        require(full - half >= 64 * 2**20, f"peaks {full / 2**20:.0f}, {half / 2**20:.0f} MiB")
        fraction = (full + half) / 2 / torch.cuda.get_device_properties(0).total_memory
        return batch, f"full{batch}", run("capped", batch, fraction)[1]

    def _oom_training(self) -> str:
        from safetensors.torch import load_file

        # passages cut to 32 tokens (the demo's are longer): 4 x 32 = 128 tokens a question
        def train(name, batch, fraction=0.0, env=None):
            config = self.reader_config(f"oom-{name}", batch_size_per_device=batch,
                                        passage_max_tokens=32, max_steps=3, eval_every_steps=3,
                                        save_every_steps=3, deterministic=True)  # fmt: skip
            return self._measured_fid(
                f"oom-{name}", fraction, "train-reader", "--config", config, "--train",
                self.data / "reader/train.json", "--dev", self.data / "reader/dev.json",
                "--init-model", self._oom_reader(), "--output", self.out / f"oom-{name}",
                "--state-dir", self.out / f"state-oom-{name}", env=env)  # fmt: skip

        batch, reference, log = self._split_run(train, 8 if self.small else 64, 128)
        lowered = re.findall(r"out of memory in a micro-batch of (\d+) tokens \(rank 0\); the "
                             r"micro-batch token limit goes from (\w+) to (\d+)", log)  # fmt: skip
        require(lowered, f"no out-of-memory error was recovered:\n{log[-2000:]}")
        want = load_file(self.out / f"oom-{reference}" / "model.safetensors")
        got = load_file(self.out / "oom-capped" / "model.safetensors")
        worst = max(float((got[k] - want[k]).abs().max()) for k in want)
        require(worst <= 1e-5, f"parameters after 3 steps differ by {worst:.1e}")
        return (f"batch {batch}: {len(lowered)} split(s), token limit {lowered[0][1]} -> "
                f"{lowered[-1][2]}, parameters within {worst:.1e} of the unsplit run's")  # fmt: skip

    def _oom_scoring(self) -> str:
        def score(name, batch, fraction=0.0, env=None):
            config = _yaml(self.out / f"oom-score-{name}.yaml", dict(
                n_passages=4, passage_max_tokens=32, batch_size=batch, precision="fp32"))  # fmt: skip
            return self._measured_fid(
                f"oom-score-{name}", fraction, "score-passages", "--config", config, "--model",
                self._oom_reader(), "--questions", self.data / "reader/train.json", "--output",
                self.out / f"oom-score-{name}.json", env=env)  # fmt: skip

        batch, reference, log = self._split_run(score, 16 if self.small else 256, 128)
        lowered = re.findall(r"out of memory in a batch of (\d+) .*?; the batch size goes from "
                             r"(\d+) to (\d+)", log)  # fmt: skip
        require(lowered, f"no out-of-memory error was recovered:\n{log[-2000:]}")

        def scores(name):
            records = json.loads((self.out / f"oom-score-{name}.json").read_text())
            return [c["reader_score"] for r in records for c in r["ctxs"]]

        want, got = scores(reference), scores("capped")
        worst = max(abs(a - b) for a, b in zip(want, got, strict=True))
        require(worst <= 1e-5, f"scores differ by {worst:.1e}")
        return (f"batch {batch}: size {lowered[0][1]} -> {lowered[-1][2]}, {len(want)} scores "
                f"within {worst:.1e} of the unsplit run's")  # fmt: skip

    def memory_plan(self) -> str:
        """benchmarks/memory/memory_plan.py on the device: `fid plan-memory`'s peak against the
        measured one (CUDA: max_memory_allocated), goal 10% (issue 28). Small: one tiny case,
        to keep the plumbing working (the CPU's goal and table are the benchmark's own)."""
        rows = self.out / "memory_plan.json"
        command = [sys.executable, "benchmarks/memory/memory_plan.py", "--device", self.device,
                   "--json", str(rows), *(["--quick"] if self.cuda else ["--smallest"])]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900,
                                env={**os.environ, **self.device_env})  # fmt: skip
        (self.out / "memory_plan.txt").write_text(result.stdout + result.stderr[-3000:])
        require(result.returncode == 0, _child_error(result.stderr))
        worst = max(json.loads(rows.read_text())["results"], key=lambda row: abs(row["error"]))
        detail = (f"worst error {worst['error']:+.1%} ({worst['model']} {worst['passages']} "
                  f"passages, checkpointing {worst['checkpointing']}); table in {rows.name}")  # fmt: skip
        if self.cuda:
            require(abs(worst["error"]) <= 0.10, detail)
        return detail


# A rank of a process group (NCCL on a GPU, gloo on a CPU): fid's collectives, then FSDP's
# sharding of the reader (every block its own unit) through a forward, backward, step and export.
_PROCESS_GROUP = """
import sys, torch
from gpu_check import require
from fid.runtime import distributed
from fid.runtime.launcher import init_from_env
import torch.distributed as dist
info = init_from_env()
device = distributed.setup(info)
if not dist.is_initialized():  # one rank: fid starts no group by itself
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
backend = dist.get_backend()
world = dist.get_world_size()
require(distributed.all_gather_objects({"x": 1}) == [{"x": 1}] * world, "all_gather_objects")
require(distributed.broadcast_object(3) == 3, "broadcast_object")
require(distributed.sum_over_ranks([2.0], device) == [2.0 * world], "sum_over_ranks")
require(distributed.any_rank(True, device) and not distributed.main_rank_flag(False, device),
        "any_rank / main_rank_flag")
distributed.barrier()
import tempfile
from pathlib import Path
from safetensors.torch import load_file
from fid.config import ReaderTrainConfig
from fid.training import sharding
from fid.training.reader import build_start_reader
from fid.training.optim import build_optimizer
from fid.training.sharded_weights import export_weights_from_shards
# as fid train-reader builds it: with more than one rank, sharded from the meta device, each
# rank reading its own slices of the start weights
reader, _ = build_start_reader(sys.argv[1], ReaderTrainConfig(sharding="fsdp", encoder_buckets=2), device)
reader.train()
units = reader.fsdp_units()
replicated = sharding.shard(reader, units)
ids = torch.randint(3, 400, (2, 3, 16), device=device)
loss = reader(ids, torch.ones_like(ids), labels=torch.randint(3, 400, (2, 4), device=device)).loss
loss.backward()
sharding.average_replicated_gradients(replicated)
norm = sharding.clip_grad_norm([p for p in reader.parameters()], 1.0)
build_optimizer(reader, 1e-3, 0.01).step()  # fid's groups: shards and replicated apart
export = Path(distributed.broadcast_object(tempfile.mkdtemp() if distributed.is_main() else None))
export_weights_from_shards(reader.t5, export)  # each rank its shards, rank 0 assembles the file
full = load_file(export / "model.safetensors") if distributed.is_main() else {"-": torch.zeros(1)}
require(full and all(torch.isfinite(v).all() for v in full.values()),
        "the exported weights are missing or not finite")
dist.destroy_process_group()
print(f"{backend}, {world} ranks: collectives ok; FSDP ({len(units)} units) step, loss {float(loss):.3f}, "
      f"grad norm {float(norm):.3f}, exported {len(full)} tensors")
"""

# A reader training step at t5-base shape (small: tiny), N = 100 passages x 250 tokens, bf16:
# its step time and model FLOPs (6 x parameters x tokens for the weights, plus attention).
_MFU = """
import json, sys, time, torch
from transformers import T5Config, T5ForConditionalGeneration
from fid.models.reader import FiDReader
from fid.runtime.precision import autocast
device, small = torch.device(sys.argv[1]), sys.argv[2] == "True"
torch.set_num_threads(1)
d, layers, heads, d_ff = (32, 2, 4, 64) if small else (768, 12, 12, 3072)
n, length, answer = (10, 64, 8) if small else (100, 250, 10)
config = T5Config(vocab_size=32128, d_model=d, d_ff=d_ff, d_kv=d // heads, num_layers=layers,
                  num_heads=heads, dropout_rate=0.0, decoder_start_token_id=0)
reader = FiDReader(T5ForConditionalGeneration(config), encoder_buckets=1).to(device).train()
reader.set_attention("auto", device)  # as training sets it: sdpa on CUDA
reader.set_activation_checkpointing(not small)
optimizer = torch.optim.AdamW(reader.parameters(), lr=1e-4)
ids = torch.randint(3, 32000, (1, n, length), device=device)
mask, labels = torch.ones_like(ids), torch.randint(3, 32000, (1, answer), device=device)
def step():
    with autocast(device, "bf16"):
        loss = reader(ids, mask, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
for _ in range(2):
    step()
sync()
started, steps = time.perf_counter(), 3 if small else 10
for _ in range(steps):
    step()
sync()
step_s = (time.perf_counter() - started) / steps
# where a step's time goes (the first H200 run measured 6.5% MFU): the kernels, by device time
from torch.profiler import ProfilerActivity, profile
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
with profile(activities=activities) as profiled:
    for _ in range(2):
        step()
    sync()
key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
with open(sys.argv[3], "w") as table:
    table.write(profiled.key_averages().table(sort_by=key, row_limit=30))
encoder = sum(p.numel() for p in reader.t5.encoder.parameters())
decoder = sum(p.numel() for p in reader.t5.decoder.parameters()) + d * 32128  # + LM head
tokens = n * length
attention = layers * (4 * tokens * length * d + 4 * answer * tokens * d + 4 * answer**2 * d)
flops = 6 * (encoder * tokens + decoder * answer) + 3 * attention
name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
print(json.dumps({"step_s": step_s, "flops": flops, "device_name": name}))
"""

# `fid` under a capped CUDA caching allocator (fraction 0: no cap), the process's peak of
# memory allocated (ProcessPeak: kept across the training log's resets; installed before fid
# is imported) written to a file at exit: argv FRACTION PEAK_FILE FID_ARGS...
_MEASURED_FID = """
import atexit, sys, torch
from gpu_check import ProcessPeak
fraction, peak_file = float(sys.argv[1]), sys.argv[2]
peak = ProcessPeak(torch.cuda) if torch.cuda.is_available() else None
if fraction and peak is not None:
    torch.cuda.set_per_process_memory_fraction(fraction)
def _write_peak():
    open(peak_file, "w").write(str(peak.bytes() if peak is not None else 0))
atexit.register(_write_peak)
from fid.cli import command
sys.argv = ["fid", "--threads", "1", *sys.argv[3:]]
command()
"""

CHECKS = ["train_precisions", "resume", "inference", "process_group", "train_retriever",
          "acceleration_speed", "mfu", "memory_plan", "oom"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--small", action="store_true", help="tiny sizes (the suite's run)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/fid-gpu-check"))
    parser.add_argument("--checks", nargs="+", default=CHECKS, choices=CHECKS)
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run this on a GPU machine, or with --device cpu --small")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with timed() as total:
        run = Run(args.device, args.small, args.out)
        for name in args.checks:
            with timed() as clock:
                try:
                    detail, ok = getattr(run, name)(), True
                except Exception as error:  # a failed check is a row of the table, not the end
                    detail, ok = f"{type(error).__name__}: {error}", False
                    traceback.print_exc()
            rows.append({"check": name, "ok": ok, "seconds": round(clock.wall_s, 1),
                         "detail": detail})  # fmt: skip
            print(f"{'ok ' if ok else 'FAIL'} {name:<20} {rows[-1]['seconds']:7.1f} s  {detail}",
                  flush=True)  # fmt: skip
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    report = {"device": device, "small": args.small, "seconds": round(total.wall_s, 1),
              "checks": rows}  # fmt: skip
    write_record(args.out / "gpu_check.json", record(__file__, report))
    print(f"{device}: {sum(r['ok'] for r in rows)}/{len(rows)} checks ok in "
          f"{report['seconds']:.0f} s; {args.out / 'gpu_check.json'}")  # fmt: skip
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
