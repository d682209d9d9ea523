"""Counting the GPUs a job sees without torch (the workflow plans its local ranks with it)."""

import subprocess
import sys

import pytest

from fid.runtime.gpus import visible_gpus


@pytest.mark.parametrize(
    "visible, expected", [("", 0), ("-1", 0), ("0", 1), ("0,1", 2), ("2, 3,", 2), ("GPU-a1b2", 1)]
)
def test_cuda_visible_devices_decides_when_set(tmp_path, visible, expected):
    driver = tmp_path / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (driver / bus).mkdir(parents=True)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": visible}, driver) == expected


def test_the_drivers_devices_count_when_nothing_is_set(tmp_path):
    driver = tmp_path / "gpus"
    assert visible_gpus({}, driver) == 0  # no NVIDIA driver loaded
    for bus in ("0000:01:00.0", "0000:41:00.0"):
        (driver / bus).mkdir(parents=True)
    assert visible_gpus({}, driver) == 2


def test_counting_imports_no_torch():
    code = "import sys, fid.runtime.gpus as g; g.visible_gpus(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
