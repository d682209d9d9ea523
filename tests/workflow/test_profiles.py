"""Profiles as Snakemake resolves them: the SLURM profile's values reach a SLURM run although
Snakemake applies the workflow profile (profiles/default) on top of it, and `--profile slurm`
works by name once `make slurm-profile` (scripts/link_slurm_profile.sh) has linked it, which
never overwrites another profile of that name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from workflow_helpers import BIN, ROOT

LINK_SCRIPT = ROOT / "scripts" / "link_slurm_profile.sh"

# Snakemake's own argument resolution (profiles, workflow profile, flags), in a fresh process:
# it caches its config folders and reads the working directory.
_RESOLVED = """
import json, sys
from snakemake.cli import parse_args
parser, args = parse_args(sys.argv[1:])
keys = ("executor", "retries", "jobs", "cores", "printshellcmds", "rerun_incomplete",
        "show_failed_logs", "latency_wait")
print(json.dumps({k: getattr(args, k) for k in keys}))
"""


def _env(config_home: Path) -> dict[str, str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home), "HF_HUB_OFFLINE": "1"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _resolved(cwd: Path, config_home: Path, *argv: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _RESOLVED, "-s", str(ROOT / "Snakefile"), *argv],
        capture_output=True, text=True, cwd=cwd, env=_env(config_home), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _link(config_home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(LINK_SCRIPT)], capture_output=True, text=True,
        env={**_env(config_home), "PYTHON": sys.executable}, timeout=120,
    )  # fmt: skip


def test_slurm_profile_values_reach_a_slurm_run(tmp_path):
    # The workflow profile is applied on top of --profile and wins per key: a `retries: 1`
    # or `cores: 2` there silently replaced the SLURM profile's (issue 25).
    slurm = _resolved(tmp_path, tmp_path / "xdg", "--profile", str(ROOT / "profiles/slurm"), "-n")
    assert slurm["executor"] == "slurm"
    assert (slurm["retries"], slurm["jobs"], slurm["latency_wait"]) == (3, 200, 60)
    assert slurm["cores"] is None
    # ... and what the workflow profile holds still applies, to every executor
    assert slurm["printshellcmds"] and slurm["rerun_incomplete"] and slurm["show_failed_logs"]
    local = _resolved(tmp_path, tmp_path / "xdg", "--cores", "all", "-n")
    assert local["executor"] is None and local["printshellcmds"] and local["rerun_incomplete"]


def test_slurm_profile_by_name_after_linking_it(tmp_path):
    config_home = tmp_path / "xdg"
    workdir = tmp_path / "run"
    workdir.mkdir()
    env = _env(config_home)
    command = [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]

    def plan(*profile):
        return subprocess.run(
            [*command, *profile, "-n"], capture_output=True, text=True, env=env, cwd=workdir,
            timeout=600,
        )  # fmt: skip

    before = plan("--profile", "slurm")
    assert before.returncode != 0 and "no profile.yaml" in before.stderr, before.stderr[-2000:]

    linked = _link(config_home)
    assert linked.returncode == 0, linked.stderr
    link = config_home / "snakemake" / "slurm"
    assert link.is_symlink() and link.resolve() == (ROOT / "profiles/slurm").resolve()
    again = _link(config_home)  # idempotent
    assert again.returncode == 0 and "already" in again.stdout

    # `snakemake --profile slurm -n`, typed in a folder of the user's (not the repository)
    by_name_plan = plan("--profile", "slurm")
    output = by_name_plan.stdout + by_name_plan.stderr
    assert by_name_plan.returncode == 0, output[-3000:]
    assert "Using profiles slurm and workflow specific profile" in output
    assert "train_reader" in output
    by_name = _resolved(workdir, config_home, "--profile", "slurm", "-n")
    assert (by_name["executor"], by_name["retries"], by_name["jobs"]) == ("slurm", 3, 200)
    # the path form keeps working beside the name
    path_plan = plan("--profile", str(ROOT / "profiles/slurm"))
    assert path_plan.returncode == 0, path_plan.stderr[-2000:]


def test_linking_never_overwrites_another_slurm_profile(tmp_path):
    config_home = tmp_path / "xdg"
    theirs = config_home / "snakemake" / "slurm"
    theirs.mkdir(parents=True)
    (theirs / "config.yaml").write_text("executor: slurm\njobs: 7\n")
    result = _link(config_home)
    assert result.returncode == 1
    assert str(theirs) in result.stderr and "not overwritten" in result.stderr
    assert "Traceback" not in result.stderr
    assert not theirs.is_symlink() and (theirs / "config.yaml").read_text().endswith("jobs: 7\n")
    # a dangling link of that name (a moved clone) is someone else's too: kept as it is
    other = tmp_path / "xdg2"
    (other / "snakemake").mkdir(parents=True)
    (other / "snakemake" / "slurm").symlink_to(tmp_path / "gone")
    assert _link(other).returncode == 1
    assert (other / "snakemake" / "slurm").readlink() == tmp_path / "gone"
