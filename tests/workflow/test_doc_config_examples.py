"""Every config example of the docs is planned as `snakemake -n` plans it (issue 49 item 3).

An example is a fenced `yaml` block of a markdown document (README.md, ARCHITECTURE.md,
config/README.md, docs/*.md) whose first line names the config it goes over (`# over config/nq.yaml`),
or, in a config file's comments, the lines after a `# Example:` line, indented `#   `, which go
over that file. Each is given to Snakemake after its config, as `--configfile CONFIG EXAMPLE`
gives it (nested keys merged), and the workflow is loaded and its DAG planned with the dry-run
executor: the schema, every config check of rules/common.smk and the job graph. All examples
run in one process (Snakemake's API, as tests/workflow/workflow_helpers.loaded_workflow
loads it): the first load imports fid and torch (~7 s), every later example plans in ~0.5 s,
where a `snakemake -n` process takes ~10 s each.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from workflow_helpers import BIN, ROOT

MARKDOWN = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "config" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]  # fmt: skip
CONFIGS = sorted(p for p in (ROOT / "config").glob("*.yaml") if p.name != "config.schema.yaml")


def markdown_examples(path):
    """(id, config it goes over, YAML text) of each fenced yaml block of a markdown file."""
    text = path.read_text()
    blocks = re.finditer(r"^( *)```yaml\n(.*?)^\1```$", text, flags=re.M | re.S)
    for block in blocks:
        indent, body = block.group(1), block.group(2)
        lines = [line.removeprefix(indent) for line in body.splitlines()]
        where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, block.start()) + 1}"
        over = re.fullmatch(r"# over (config/[\w.-]+\.yaml)", lines[0] if lines else "")
        assert over, f"{where}: a yaml block starts with `# over config/<file>.yaml`"
        yield where, ROOT / over.group(1), "\n".join(lines[1:]) + "\n"


def comment_example_lines(lines):
    """{line index of a `# Example:`: the indices of its lines} in a config file's lines."""
    examples = {}
    for number, line in enumerate(lines):
        if line == "# Example:":
            body = []
            for k in range(number + 1, len(lines)):
                if not lines[k].startswith("#   "):
                    break
                body.append(k)
            examples[number] = body
    return examples


def config_comment_examples(path):
    """(id, this config, YAML text) of each `# Example:` of a config file's comments."""
    lines = path.read_text().splitlines()
    for number, body in comment_example_lines(lines).items():
        where = f"{path.relative_to(ROOT)}:{number + 1}"
        assert body, f"{where}: `# Example:` is followed by lines indented `#   `"
        yield where, path, "".join(lines[i].removeprefix("#   ") + "\n" for i in body)


EXAMPLES = {
    where: (config, text)
    for source in [*map(markdown_examples, MARKDOWN), *map(config_comment_examples, CONFIGS)]
    for where, config, text in source
}

# One process plans every example: {id: [config, example, workdir]} on stdin; on stdout one JSON
# line, {id: {"error": message or null, "jobs": {rule: count}, "reader_temperature":
# {retriever stage: the value its job reads}}}.
_PLAN_ALL = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings import types as s

results = {}
for name, (config, example, workdir) in json.load(sys.stdin).items():
    try:
        with SnakemakeApi(s.OutputSettings(quiet={s.Quietness.ALL})) as api:
            workflow_api = api.workflow(
                snakefile=Path(sys.argv[1]), workdir=Path(workdir),
                config_settings=s.ConfigSettings(configfiles=[Path(config), Path(example)]),
                resource_settings=s.ResourceSettings(cores=64),
                storage_settings=s.StorageSettings(), workflow_settings=s.WorkflowSettings(),
                deployment_settings=s.DeploymentSettings(),
            )
            workflow_api.dag().execute_workflow(executor="dryrun")
            workflow = workflow_api._workflow
            jobs = {}
            for job in workflow.dag.jobs:
                jobs[job.rule.name] = jobs.get(job.rule.name, 0) + 1
            checked = workflow.globals["CHECKED"]
            temperatures = {stage: knobs.reader_temperature for stage, knobs in checked.items()
                            if stage.startswith("retriever")}
        results[name] = {"error": None, "jobs": jobs, "reader_temperature": temperatures}
    except Exception as error:
        results[name] = {"error": f"{type(error).__name__}: {error}"}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """Every example planned, by id."""
    todo = {}
    for n, (where, (config, text)) in enumerate(EXAMPLES.items()):
        workdir = tmp_path_factory.mktemp(f"example{n}")
        (workdir / "example.yaml").write_text(text)
        todo[where] = [str(config), str(workdir / "example.yaml"), str(workdir)]
    result = subprocess.run(
        [sys.executable, "-c", _PLAN_ALL, str(ROOT / "Snakefile")],
        input=json.dumps(todo), capture_output=True, text=True, timeout=600,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path_factory.getbasetemp()),
             "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_docs_hold_examples_of_each_kind():
    """The extraction finds what the docs hold: blocks in config/README.md over the demo, in
    docs/index.md over nq.yaml, and examples in config.yaml's and nq.yaml's comments (an
    extractor that finds nothing would pass every example)."""
    found = {(where.split(":")[0], config.name) for where, (config, _) in EXAMPLES.items()}
    assert {("config/README.md", "config.yaml"), ("docs/index.md", "nq.yaml"),
            ("config/config.yaml", "config.yaml"), ("config/nq.yaml", "nq.yaml"),
            ("config/tqa.yaml", "tqa.yaml")} <= found, found  # fmt: skip


def test_no_config_example_outside_the_checked_forms():
    """A config snippet written inline (`{mode: pdist}` in a sentence, `key: {...}` in a
    comment) is refused: it would be read by people and by no test. Write it as a yaml block
    or a `# Example:` instead."""
    inline = re.compile(r"\{\s*[A-Za-z_]\w*:\s")  # a YAML flow mapping: {key: value ...}
    unchecked = []
    for path in MARKDOWN:
        text = re.sub(r"^( *)```yaml\n.*?^\1```$", "", path.read_text(), flags=re.M | re.S)
        unchecked += [f"{path.name}: {code}" for code in re.findall(r"`[^`\n]+`", text)
                      if inline.search(code)]  # fmt: skip
    for path in CONFIGS:
        lines = path.read_text().splitlines()
        checked = {i for body in comment_example_lines(lines).values() for i in body}
        for number, line in enumerate(lines):
            comment = line[1:] if line.startswith("#") else line.partition(" #")[2]
            if inline.search(comment) and number not in checked:
                unchecked.append(f"{path.name}:{number + 1}: {line.strip()}")
    assert not unchecked, "\n".join(unchecked)


@pytest.mark.parametrize("where", list(EXAMPLES))
def test_example_plans(planned, where):
    """The example goes over its config as Snakemake merges config files, and the workflow
    plans it: schema, config checks and DAG (what `snakemake -n` checks)."""
    result = planned[where]
    assert result["error"] is None, f"{where}:\n{EXAMPLES[where][1]}\n{result['error']}"
    assert result["jobs"].get("all") == 1, result["jobs"]


def test_documented_signals_train_at_their_modes_temperature(planned):
    """config/README.md's signals on the demo: its own teacher (attention_mass) trains at the
    demo's 0.1; pdist, loop, EMDR2 and the two controls at 1.0, as the table there says and as
    the benchmark measured them (they inherited attention mass's 0.1, and EMDR2 was refused for it)."""
    (where,) = [w for w, (_, text) in EXAMPLES.items()
                if w.startswith("config/README.md") and "loop: {score_passages" in text]  # fmt: skip
    result = planned[where]
    assert result["error"] is None, result["error"]
    signals = ("pdist", "loop", "emdr2", "uniform", "in_batch")  # each with 3 seeds' stages
    stages = [
        f"retriever_signal_{n}{s}" for n in signals for s in ("", "_seed0", "_seed1", "_seed2")
    ]
    assert result["reader_temperature"] == {
        "retriever": 0.1, "retriever_later": 0.1, **dict.fromkeys(stages, 1.0)}  # fmt: skip
    assert result["jobs"]["train_retriever_signal"] == 3 * len(signals)  # distillation_seeds
