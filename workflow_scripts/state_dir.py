"""Prints the resumable-state folder of a training job, ROOT/<key>.

The key hashes the job's stage config (its content) and the identity (path, size, mtime) of
every input file, so a job restarted with the same inputs (a retry, a SLURM requeue, a killed
run) resumes its checkpoints, while a rerun caused by new inputs or new knobs starts afresh
instead of resuming a finished run of the old ones. Stale sibling folders are deleted.

    python workflow_scripts/state_dir.py ROOT CONFIG.yaml INPUT...
"""

import hashlib
import shutil
import sys
from pathlib import Path

root, config, *inputs = sys.argv[1:]
digest = hashlib.sha256(Path(config).read_bytes())
for item in filter(None, inputs):
    path = Path(item)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        stat = file.stat() if file.exists() else None  # a hub name is not a file
        digest.update(f"{file}:{stat and stat.st_size}:{stat and stat.st_mtime_ns}\n".encode())
key = digest.hexdigest()[:16]
root = Path(root)
root.mkdir(parents=True, exist_ok=True)
for old in root.iterdir():
    if old.name != key:
        shutil.rmtree(old) if old.is_dir() else old.unlink()
print(root / key)
