"""The torch-sensitive tests under the LOWEST torch that pyproject.toml allows (issue 43 item 8).

    .venv/bin/python .ci/lowest_torch.py              # after `make setup`; extra args go to pytest
    .venv/bin/python .ci/lowest_torch.py --install-only

`make test` runs every test under the Makefile's torch (the top of the range); this runs the
files where torch's version matters (FSDP2 on 2 gloo ranks, DTensor, torch.distributed.checkpoint,
autocast, weights_only loads, the reader's forward and generation, the memory tracer) under the
floor of pyproject's `torch>=X,<Y`, so the floor is a tested claim, not a guess.

torch X goes into its own folder with `pip install --target` (no venv): the same wheel and
dependencies as `pip install torch==X` (PyPI has no CPU-only build of X: the CUDA one, whose
nvidia-* libraries `import torch` loads even without a GPU: ~2.6 GB downloaded, ~4.6 GB on
disk, ~1 min here). It is kept in ~/.cache/fid (FID_LOWEST_TORCH_DIR to move it) and reused.
The tests then run with .venv's python and packages, that folder first on PYTHONPATH (every
subprocess a test starts, torchrun's ranks and `python -m fid` included, inherits it), and
FID_EXPECT_TORCH=X, which tests/test_torch_range.py checks in the test processes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# The files whose code paths depend on torch's version: keep this list short (CI's budget).
TESTS = [
    "tests/test_torch_range.py",
    "tests/test_sharding.py",  # FSDP2 fully_shard on 2 gloo ranks, DCP checkpoints, clipping
    "tests/test_update.py",  # the optimizer step over DTensor shards and plain tensors
    "tests/test_distributed.py",  # torchrun ranks through fid's collectives, FSDP training
    "tests/test_accumulation.py",  # set_requires_gradient_sync, held unsharded gradients
    "tests/test_sharded_weights.py",  # DCP's HuggingFaceStorageReader/Writer
    "tests/test_pretrained_loading.py",
    "tests/test_precision.py",  # autocast, bf16 support probes
    "tests/test_reader.py",  # the reader's forward (SDPA) and generation
    "tests/test_accelerated_generation.py",
    "tests/test_training_state.py",  # weights_only / mmap loads, RNG states
    "tests/test_memory_plan.py",  # torch.distributed._tools.mem_tracker (private)
]
# Left out (~7 of the files' ~17 CPU-minutes): signal-and-resume runs, eval/scoring on 1-3
# ranks and compact lists, which exercise fid's own logic more than torch's.
DESELECT = [
    "tests/test_distributed.py::test_interrupted_runs_end_bitwise_equal",
    "tests/test_distributed.py::test_eval_and_scoring_lose_nothing_on_1_2_3_ranks",
    "tests/test_distributed.py::test_a_signal_outside_the_loop_is_no_kill",
    "tests/test_distributed.py::test_compact_lists_scored_on_2_ranks_equal_fid_json_in_one_process",
]


def torch_requirement() -> Requirement:
    """pyproject.toml's torch requirement (a regex: tomllib is 3.11+, the package 3.10+)."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'^\s*"(torch[^"]*)"', text, flags=re.MULTILINE)
    if found is None:
        raise SystemExit("pyproject.toml names no torch requirement")
    return Requirement(found.group(1))


def floor(requirement: Requirement) -> str:
    """The X of `torch>=X`: the lowest release the range allows."""
    lows = [s.version for s in requirement.specifier if s.operator == ">="]
    if len(lows) != 1:
        raise SystemExit(f"pyproject.toml's {requirement} has no single `>=` floor")
    return lows[0]


def same_release(version: str | None, wanted: str) -> bool:
    """`version` (e.g. 2.11.0+cu130) is release `wanted` (e.g. 2.11)."""
    return version is not None and Version(Version(version).base_version) == Version(wanted)


def installed_version(folder: Path) -> str | None:
    """The torch version in `folder` (its dist-info), or None."""
    found = sorted(folder.glob("torch-*.dist-info"))
    return found[0].name.removeprefix("torch-").removesuffix(".dist-info") if found else None


def install(version: str, folder: Path) -> None:
    """torch==version and its dependencies into `folder` (replaced whole, atomically)."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"lowest torch: installing torch=={version} into {folder}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--target", str(partial), f"torch=={version}"], check=True)  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)


def main(argv: list[str]) -> int:
    version = floor(torch_requirement())
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    default = Path.home() / ".cache" / "fid" / f"torch-{version}-{py}"
    folder = Path(os.environ.get("FID_LOWEST_TORCH_DIR", default)).expanduser().resolve()
    if not same_release(installed_version(folder), version):
        install(version, folder)
    env = dict(os.environ, FID_EXPECT_TORCH=version)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    probe = "import torch; print(torch.__version__)"
    got = subprocess.run([sys.executable, "-c", probe], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    print(f"lowest torch: {got} from {folder}", flush=True)
    if not same_release(got, version):
        raise SystemExit(f"expected torch {version} first on the path, got {got}")
    if "--install-only" in argv:
        return 0
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
               "--dist", "loadfile", *(f"--deselect={t}" for t in DESELECT), *TESTS, *argv]  # fmt: skip
    print("lowest torch:", " ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
