"""benchmarks/gpu/gpu_check.py, the GPU path's acceptance run, on a CPU with tiny sizes: every check
a CPU can run passes (bf16 training against the fp32 run, the signal-and-resume bitwise check,
device-against-CPU inference, a one-rank process group with FSDP, the retriever, the
acceleration table, the MFU figure, the memory plan's smoke case, out-of-memory recovery under
a simulated error), so that the script works the day a GPU runs it; and, in seconds, the checks'
own logic where a CPU alone cannot reach it: the oom check's peak across the training log's
resets, fp16 training whose steps made no update, checks that hold under `python -O`."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_acceptance_run_passes_on_a_cpu(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu" / "gpu_check.py"), "--device", "cpu", "--small",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())["results"]
    checks = {row["check"]: row for row in report["checks"]}
    assert list(checks) == ["train_precisions", "resume", "inference", "process_group",
                            "train_retriever", "acceleration_speed", "mfu", "memory_plan",
                            "oom"]  # fmt: skip
    assert all(row["ok"] for row in checks.values()), checks
    assert "fp16" not in checks["train_precisions"]["detail"]  # CUDA only
    assert "bitwise equal" in checks["resume"]["detail"]
    assert checks["process_group"]["detail"].startswith("gloo, 2 ranks: collectives ok; FSDP")
    assert "| plain |" in (tmp_path / "acceleration_speed.txt").read_text()
    assert "Self CPU" in (tmp_path / "mfu_profile.txt").read_text()  # the step's profile
    assert checks["memory_plan"]["detail"].startswith("worst error ")
    assert len(json.loads((tmp_path / "memory_plan.json").read_text())["results"]) == 1
    # out of memory (simulated on a CPU): training and scoring split, and equal the unsplit runs
    assert re.fullmatch(r"training: batch 8: \d+ split\(s\), token limit none -> \d+, parameters "
                        r"within \S+ of the unsplit run's; scoring: batch 16: size 16 -> 8, "
                        r"\d+ scores within \S+ of the unsplit run's", checks["oom"]["detail"])  # fmt: skip
    print(result.stdout)


# ------------------------------------------------------------------ fast: the checks' own logic
@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu/gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeAllocator:
    """CUDA's allocator statistics as torch.cuda reports them: memory allocated now, and its
    peak since the last reset_peak_memory_stats."""

    def __init__(self):
        self.allocated = self.peak = 0

    def allocate(self, size: int) -> None:
        self.allocated += size
        self.peak = max(self.peak, self.allocated)

    def free(self, size: int) -> None:
        self.allocated -= size

    def max_memory_allocated(self, device=None) -> int:
        return self.peak

    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak = self.allocated


def test_the_measured_peak_outlives_the_training_logs_resets(gpu_check, monkeypatch):
    """The oom check's peaks (issue 43 item 6): max_memory_allocated at exit was the last log
    interval's peak, so a batch and its half measured alike and the check could never pass."""
    import torch

    from fid.runtime.logs import PeakMemory

    allocator = FakeAllocator()
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", allocator.max_memory_allocated)
    for module in (torch.cuda, torch.cuda.memory):
        monkeypatch.setattr(module, "reset_peak_memory_stats", allocator.reset_peak_memory_stats)
    peak = gpu_check.ProcessPeak(torch.cuda)  # the child installs it before importing fid
    memory = PeakMemory(torch.device("cuda"))  # the training log's: it resets on creation
    allocator.allocate(1000)  # step 1's activations
    allocator.free(1000)
    memory.reset()  # as the interval log does at the step after each line
    allocator.allocate(300)  # the last step, smaller (a short last batch)
    allocator.free(300)
    assert torch.cuda.max_memory_allocated() == 300  # what the child used to write
    assert peak.bytes() == 1000
    torch.cuda.memory.reset_peak_memory_stats()  # reset_max_memory_allocated's way in
    allocator.allocate(2000)
    assert peak.bytes() == 2000


def _train_log(skipped=(), unfinite_norms=(), steps=12) -> list[dict]:
    """A training log as fid/training/interval_log.py writes it (one line a step): a skipped
    step's gradient norm is not finite (fp16's scaler skips exactly those)."""
    return [{"kind": "train", "step": step, "loss": 6.5 - 0.1 * step, "lr": 1e-3,
             "skipped_steps": int(step in skipped), "grad_norm": math.inf if step in skipped
             else math.nan if step in unfinite_norms else 2.5} for step in range(1, steps + 1)]  # fmt: skip


def _write_model(folder: Path, lines: list[dict], weight: float) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.full((2, 2), weight)}, folder / "model.safetensors")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def _precision_run(gpu_check, out: Path, fp16_log: list[dict], trained_weight: float = 1.0):
    """A CUDA Run whose training writes the given fp16 log (bf16's is a clean one): the fp32
    reference and the start model already there, so that only train_precisions' checks run."""
    run = gpu_check.Run.__new__(gpu_check.Run)  # no demo world, no models to build
    run.device, run.small, run.out, run.cuda, run.device_env = "cuda", True, out, True, {}
    _write_model(out / "init_reader", [], 0.0)
    _write_model(out / "fp32-cpu", _train_log(), 0.5)

    def train_reader(name, config, env):
        return _write_model(out / name, fp16_log if name == "fp16" else _train_log(),
                            trained_weight)  # fmt: skip

    run.train_reader = train_reader
    return run


def test_fp16_training_passes_with_the_scalers_first_skips(gpu_check, tmp_path):
    run = _precision_run(gpu_check, tmp_path, _train_log(skipped=(1, 2, 3)))
    assert run.train_precisions() == (
        "fp16 first losses within 0.0e+00 of fp32 CPU, 9 of 12 steps applied; "
        "bf16 first losses within 0.0e+00 of fp32 CPU, 12 of 12 steps applied"
    )


@pytest.mark.parametrize(("fp16_log", "weight", "message"), [
    (_train_log(skipped=range(1, 13)), 1.0, r"fp16: 12 of 12 steps skipped"),
    (_train_log(skipped=range(1, 7)), 1.0, r"fp16: 6 of 12 steps skipped"),
    (_train_log(skipped=(1, 9)), 1.0, r"fp16: grad_norm not finite after step 5: .*\(9, inf\)"),
    (_train_log(unfinite_norms=(12,)), 1.0, r"fp16: grad_norm not finite .*\(12, nan\)"),
    ([{k: v for k, v in line.items() if k != "grad_norm"} for line in _train_log()], 1.0,
     r"fp16: grad_norm not finite .*\(6, None\)"),
    (_train_log(), 0.0, r"fp16: all 1 tensors equal the start model's"),
], ids=["every step skipped", "beyond calibration", "a late skip", "a late NaN norm",
        "no norm logged", "weights unchanged"])  # fmt: skip
def test_fp16_training_fails_when_its_steps_made_no_updates(gpu_check, tmp_path, fp16_log,
                                                            weight, message):  # fmt: skip
    """Finite losses passed a run whose loss scaler skipped every step (issue 43 item 6)."""
    run = _precision_run(gpu_check, tmp_path, fp16_log, trained_weight=weight)
    with pytest.raises(gpu_check.CheckFailed, match=message):
        run.train_precisions()


def _child_scripts(tree: ast.Module, gpu_check) -> dict[str, str]:
    """The script texts that the checks run as programs of their own (`_NAME = \"\"\"...\"\"\"`)."""
    names = [target.id for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if re.fullmatch(r"_[A-Z_]+", target.id)]  # fmt: skip
    return {name: getattr(gpu_check, name) for name in names
            if isinstance(getattr(gpu_check, name), str)}  # fmt: skip


def test_no_check_is_an_assert_that_python_O_would_drop(gpu_check):
    source = (ROOT / "benchmarks/gpu/gpu_check.py").read_text()
    tree = ast.parse(source)
    scripts = _child_scripts(tree, gpu_check)
    assert {"_PROCESS_GROUP", "_MFU", "_MEASURED_FID"} <= set(scripts)
    for name, text in [("gpu_check.py", source), *scripts.items()]:
        asserts = [node.lineno for node in ast.walk(ast.parse(text))
                   if isinstance(node, ast.Assert)]  # fmt: skip
        assert not asserts, f"{name}: assert on line(s) {asserts}"


def test_a_failing_check_still_fails_under_python_O(gpu_check):
    """A child script (as the checks run one) calling a check whose condition fails."""
    every_step_skipped = json.dumps(_train_log(skipped=range(1, 13)))
    body = ("import json\nfrom gpu_check import require_updates\n"
            "print('optimize', sys.flags.optimize)\n"
            f"require_updates('fp16', json.loads({every_step_skipped!r}))\n")  # fmt: skip
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONOPTIMIZE"}
    result = subprocess.run([sys.executable, "-O", "-c", gpu_check._script(body)],
                            capture_output=True, text=True, timeout=60, env=environment)  # fmt: skip
    assert result.stdout.strip() == "optimize 1"
    assert result.returncode == 1
    assert "CheckFailed: fp16: 12 of 12 steps skipped" in result.stderr
