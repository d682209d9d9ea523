"""pyproject.toml's torch range is what is tested (issue 43 item 8): its floor is the GPU
machines' torch (2.11) and .ci/lowest_torch.py runs the torch-sensitive tests under it, its top
is the Makefile's torch that `make test` runs, and the torch in use lies inside it. These run in
`make test` and again under the floor (there FID_EXPECT_TORCH names the floor)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
GPU_TORCH = Version("2.11")  # the lent H200's torch (README, GPU section)
# torch.distributed.checkpoint exports HuggingFaceStorageReader/Writer (sharded_weights.py)
# from 2.8 (2.7 had only private _HuggingFace* classes); transformers 5 wants 2.6.
API_FLOOR = Version("2.8")


def _script():
    spec = importlib.util.spec_from_file_location("lowest_torch", ROOT / ".ci/lowest_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _base(version: str) -> Version:
    return Version(Version(version).base_version)


def test_range_runs_from_the_gpu_torch_to_the_makefiles():
    script = _script()
    requirement = script.torch_requirement()
    low = Version(script.floor(requirement))
    assert API_FLOOR <= low <= GPU_TORCH, requirement
    assert requirement.specifier.contains(GPU_TORCH), requirement
    pin = re.search(r"^TORCH \?= torch==(\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    top = Version(pin.group(1))
    assert requirement.specifier.contains(top), (requirement, top)
    # the top is tested: the next minor release after the Makefile's is outside the range
    assert not requirement.specifier.contains(Version(f"{top.major}.{top.minor + 1}")), requirement


def test_the_torch_in_use_is_in_range_and_the_expected_one():
    requirement = _script().torch_requirement()
    running = _base(torch.__version__)
    assert requirement.specifier.contains(running), (
        f"torch {torch.__version__} is outside pyproject.toml's tested {requirement}"
    )
    expected = os.environ.get("FID_EXPECT_TORCH")
    if expected:  # under .ci/lowest_torch.py: this process and its subprocesses run the floor
        assert running == _base(expected), torch.__version__
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    assert child.stdout.strip() == torch.__version__


def test_the_lowest_torch_run_lists_existing_test_files():
    tests = _script().TESTS
    assert "tests/test_torch_range.py" in tests
    for name in tests:
        assert (ROOT / name).is_file(), name


def test_the_version_dependent_torch_apis_fid_uses_exist():
    """Each name here appeared in, or is private to, some torch release: a torch that lacks
    one fails here by name rather than deep inside a run."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
    from torch.distributed.tensor import DTensor

    assert {"PARAM", "BUFFER", "GRAD", "OPT", "ACT", "TEMP", "OTH"} <= set(_MemRefType.__members__)
    for name in ("set_requires_gradient_sync", "_get_fsdp_state"):
        assert hasattr(FSDPModule, name), name
    assert callable(torch.get_autocast_dtype) and callable(torch.cpu._is_amx_tile_supported)
    assert callable(torch.cpu._is_avx512_bf16_supported)
    assert all((HuggingFaceStorageReader, HuggingFaceStorageWriter, get_state_dict,
                set_state_dict, fully_shard, register_fsdp_forward_method, DTensor, MemTracker))  # fmt: skip
