"""How many GPUs this machine shows its jobs, known without importing torch.

The workflow plans its launch lines (how many local ranks a job starts) when the DAG is
built, in a process that must stay light; importing torch only to count devices would cost
seconds per Snakemake call.
"""

import os
from pathlib import Path

NVIDIA_DEVICES = Path("/proc/driver/nvidia/gpus")


def visible_gpus(environ=os.environ, driver_devices: Path = NVIDIA_DEVICES) -> int:
    """CUDA_VISIBLE_DEVICES when set (an empty value or -1 hides every GPU), else the devices
    the NVIDIA driver lists (0 where no driver is loaded)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() not in ("", "-1")])
    if not driver_devices.is_dir():
        return 0
    return sum(1 for _ in driver_devices.iterdir())
