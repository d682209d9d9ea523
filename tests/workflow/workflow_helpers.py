"""Helpers of the workflow tests (tests/workflow/test_*.py): run Snakemake on the repository's
Snakefile in a scratch working directory and read what it planned (jobs per rule, wildcards,
resources, threads, shell commands)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: snakemake, fid, torchrun
SAMPLES = ROOT / "samples"

if shutil.which("snakemake", path=str(BIN)) is None:
    pytest.skip("snakemake is not installed in this environment", allow_module_level=True)


def snakemake(
    workdir: Path, *args: str, timeout: float = 1800, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs `snakemake -s ROOT/Snakefile --directory WORKDIR ARGS` with the venv on PATH and no
    hub (HF_HUB_OFFLINE=1), `env` over that (a value None removes the variable)."""
    base = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    base["HF_HUB_OFFLINE"] = "1"
    env = {k: v for k, v in {**base, **(env or {})}.items() if v is not None}
    command = [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def dry_run(workdir: Path, *args: str) -> str:
    """The output of a dry run that must succeed."""
    result = snakemake(workdir, "-n", "-p", "--cores", "64", *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a plan: rule -> number of jobs."""
    table = output.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    rows = (line.split() for line in table.splitlines()[3:])
    return {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[0] != "total"}


def planned_jobs(output: str) -> list[dict]:
    """Every planned job: {"rule", "wildcards": {...}, "resources": {...}, "threads", "shell"}."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", output):
        head = re.match(r"(?:local)?rule (\w+):\n", block)
        if not head or head.group(1) == "all":
            continue
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, flags=re.M))
        wildcards = dict(kv.split("=", 1) for kv in fields.get("wildcards", "").split(", ") if kv)
        resources = dict(kv.split("=", 1) for kv in fields.get("resources", "").split(", ") if kv)
        shell = re.search(r"^Shell command: (.*)$", block, flags=re.M)
        jobs.append(
            dict(rule=head.group(1), wildcards=wildcards, resources=resources,
                 threads=int(fields.get("threads", 1)), shell=shell and shell.group(1))
        )  # fmt: skip
    return jobs


def write_config(path: Path, base: str | Path, **changes) -> Path:
    """A copy of a config file with top-level keys replaced (None deletes the key)."""
    data = yaml.safe_load(Path(base).read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# A workflow loaded through Snakemake's API (no run): prints one JSON value of it.
_LOADED_WORKFLOW = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings import types as s

with SnakemakeApi(s.OutputSettings(quiet={s.Quietness.ALL})) as api:
    workflow = api.workflow(
        snakefile=Path(sys.argv[1]), workdir=Path(sys.argv[2]),
        config_settings=s.ConfigSettings(configfiles=[Path(sys.argv[3])]),
        resource_settings=s.ResourceSettings(), storage_settings=s.StorageSettings(),
        workflow_settings=s.WorkflowSettings(), deployment_settings=s.DeploymentSettings(),
    )._workflow
    print(json.dumps(EXPRESSION))
"""


def loaded_workflow(workdir: Path, config: Path, expression: str):
    """`expression` (over the loaded `workflow`) for a config file, as Snakemake loaded it."""
    script = _LOADED_WORKFLOW.replace("EXPRESSION", expression)
    result = subprocess.run(
        [sys.executable, "-c", script, ROOT / "Snakefile", workdir, config],
        capture_output=True, text=True, cwd=workdir, timeout=120,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(workdir)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def rule_shell_commands(workdir: Path, config: dict) -> dict[str, str]:
    """Every rule's shell command as Snakemake loaded the rules for `config` (unformatted:
    `{input.x:q}` fields as written)."""
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))
    expression = "{r.name: r.shellcmd for r in workflow.rules if r.shellcmd}"
    return loaded_workflow(workdir, workdir / "c.yaml", expression)


def local_rules(workdir: Path, config: Path) -> set[str]:
    """The rules Snakemake runs itself for a config file (a dry run never says which: jobs.py,
    "in dryrun, we don't want to display a decision whether local or not")."""
    return set(loaded_workflow(workdir, config, "sorted(workflow._localrules)"))


def report_pages(report: Path) -> dict[str, str]:
    """The HTML pages embedded in a `snakemake --report` file: {result path: page}, decoded from
    the data URIs of its `results` object (what the report shows when an item is opened)."""
    import base64

    text = report.read_text()
    found = re.search(r'<script id="results">\s*var results = (.*?);\s*</script>', text, re.S)
    assert found, f"{report}: no results object"
    pages = {}
    for path, entry in json.loads(found.group(1)).items():
        if entry["mime_type"] == "text/html":
            pages[path] = base64.b64decode(entry["data_uri"].split("base64,", 1)[1]).decode()
    return pages


def report_labels(report: Path) -> dict[str, dict | None]:
    """{result path: its labels} of a `snakemake --report` file (what its menu lists)."""
    text = report.read_text()
    found = re.search(r'<script id="results">\s*var results = (.*?);\s*</script>', text, re.S)
    assert found, f"{report}: no results object"
    return {path: entry["labels"] for path, entry in json.loads(found.group(1)).items()}


def table_rows(page: str) -> list[list[str]]:
    """The cells of each body row of the (one) table in a report page, as text."""
    import html

    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in page else ""
    return [
        [html.unescape(cell).strip() for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def disk_plan(console: str) -> list[tuple[str, float | None, str]]:
    """(stage, planned bytes or None, folder) of the disk plan a run printed when it loaded
    (rules/disk.smk), before its first job."""
    table = console.split("disk plan (what each stage will hold once done):\n", 1)[1]
    rows = []
    for line in table.splitlines()[1:]:
        if line.startswith("total"):
            return rows
        match = re.match(r"(.+?)\s+(?:([\d.]+) (KiB|MiB|GiB)|\?)  (\S+)  \(", line)
        assert match, line
        planned = float(match[2]) * _UNITS[match[3]] if match[2] else None
        rows.append((match[1], planned, match[4]))
    raise AssertionError("the disk plan has no total")


def check_disk_plan(console: str, workdir: Path, within: float = 0.2) -> list[str]:
    """The disk plan a finished run printed at its start against what the run holds: each
    stage's folder and the total within `within` (the constant row of configs and logs aside,
    and rows under 1% of the total, whose few files' sizes a formula does not follow)."""
    from fid.runtime.disk_plan import folder_bytes

    rows = [row for row in disk_plan(console) if not row[0].startswith("configs")]
    total = sum(planned or 0 for _, planned, _ in rows)
    actual_total = sum(folder_bytes(workdir / folder) for _, _, folder in rows)
    lines, wrong = [], []
    for stage, planned, folder in rows:
        held = folder_bytes(workdir / folder)
        lines.append(f"{stage}: planned {planned}, holds {held}")
        if planned is not None and planned >= total / 100 and abs(planned - held) > within * held:
            wrong.append(lines[-1])
    assert not wrong, "\n".join(wrong)
    assert abs(total - actual_total) <= within * actual_total, (total, actual_total)
    return lines
