"""Config values never run as shell code. Every string the schema accepts (found by walking
config/config.schema.yaml, so a new key is covered without editing this file) either refuses
hostile values at DAG time with its key named, or reaches jobs that never run it: no marker
file appears in a dry run nor in real jobs (download, extract, prepare_questions, stage_config,
report_config). And every field of every rule's shell command is quoted (`:q`) or a validated
number, so a value the schema lets through still reaches a shell as one word.

A value `idx.json$(touch X)` for data.questions.dev.index ran `touch X` before the fix."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
import sys
import tarfile
from pathlib import Path

import jsonschema
import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate
from workflow_helpers import ROOT, SAMPLES, dry_run, rule_shell_commands, snakemake

sys.path.insert(0, str(ROOT / "tests"))
from loopback_hub import LoopbackHub  # noqa: E402

SCHEMA_FILE = ROOT / "config" / "config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_FILE.read_text())
MARKER = "pwned"
# Each payload makes a shell that evaluates it create the file MARKER-<n> in its working
# directory; they are appended to a key's ordinary value, so prefix patterns still match.
PAYLOADS = [
    "$(touch MARK)",
    "`touch MARK`",
    "; touch MARK",
    "' ; touch MARK ; '",
    '" ; touch MARK ; "',
    "\ntouch MARK\n",
    ">MARK",
    "&&touch${IFS}MARK",
    "\n",  # no marker: a trailing newline that Python's `$` lets through a plain `^...$`
]
TARGETS = [f"results/own/data/{split}.jsonl" for split in ("train", "dev", "test")]
TARGETS += ["results/own/report/config.yaml"]
HUB_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def _resolve(node: dict) -> dict:
    """A schema node with its local `$ref` (to #/$defs/...) merged in."""
    if "$ref" not in node:
        return node
    target = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def string_keys(node: dict = SCHEMA, path: tuple = ()) -> list[tuple]:
    """Key paths of every string the schema accepts: '*' is any entry of a mapping, '<name>'
    the name of an entry itself, '[]' an item of a list."""
    node = _resolve(node)
    branches = [_resolve(b) for b in node.get("oneOf", []) + node.get("anyOf", [])]
    if "string" in {node.get("type"), *(b.get("type") for b in branches)} or "enum" in node:
        return [path]
    keys = []
    for key, sub in node.get("properties", {}).items():
        keys += string_keys(sub, (*path, key))
    if isinstance(node.get("additionalProperties"), dict):
        keys += string_keys(node["additionalProperties"], (*path, "*"))
    if "propertyNames" in node:
        keys.append((*path, "<name>"))
    if "items" in node:
        keys += string_keys(node["items"], (*path, "[]"))
    return keys


def _entry(mapping: dict, wanted: str | None) -> str:
    """The entry of a mapping that '*' stands for: the first that has the wanted key."""
    assert mapping, f"the base config has no entry to hold {wanted}: add one in _base_config"
    named = (k for k, v in mapping.items() if isinstance(v, dict) and wanted in v)
    return next(named, next(iter(mapping)))


def concrete(config, path: tuple) -> list:
    """The instance path in config that a key path stands for, as jsonschema reports it:
    '*' is an entry's name, '[]' the first item, and '<name>' (and below) the mapping."""
    names, node = [], config
    for i, key in enumerate(path):
        if key == "<name>":
            break
        if key == "*":
            key = _entry(node, path[i + 1] if i + 1 < len(path) else None)
        key = 0 if key == "[]" else key
        names.append(key)
        node = node[key] if isinstance(node, list) or key in (node or {}) else None
    return names


def get(config, path: tuple):
    """The value at a key path, or None."""
    if "<name>" in path:
        return _entry(get(config, path[: path.index("<name>")]), None)
    node = config
    for key in concrete(config, path):
        node = node[key] if isinstance(node, list) or key in (node or {}) else None
    return node


def put(config, path: tuple, value) -> dict:
    """A copy of config with value at a key path (made where missing)."""
    config = copy.deepcopy(config)
    node = config
    for i, key in enumerate(path[:-1]):
        if key == "*":
            key = _entry(node, path[i + 1])
        if path[i + 1] == "[]":
            node[key] = [value]
            return config
        if path[i + 1] == "<name>":
            node[key] = {value if k == _entry(node[key], None) else k: v
                         for k, v in node[key].items()}  # fmt: skip
            return config
        node = node.setdefault(key, {})
    node[_entry(node, None) if path[-1] == "*" else path[-1]] = value  # a mapping's value
    return config


def dotted(path: tuple) -> str:
    return ".".join(path)


def _base_config(workdir: Path) -> dict:
    """config/own_data.yaml on samples/squad-open-tiny with every optional string key in use:
    a download (a file:// URL of a local tar archive), an extract member, an index file, both
    kinds of pretrained encoder, an accelerated evaluation and SLURM resources."""
    data = workdir / "data" / "own"
    data.mkdir(parents=True)
    for name in ("psgs_w100.tsv", "questions.jsonl"):
        shutil.copy(SAMPLES / "squad-open-tiny" / name, data / name)
    (data / "idx.json").write_text(json.dumps(list(range(40))))
    archive = workdir / "archive.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(data / "questions.jsonl", arcname="questions.jsonl")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    config = yaml.safe_load((ROOT / "config" / "own_data.yaml").read_text())
    config["data"]["downloads"] = {
        "archive.tar": {
            "url": archive.as_uri(),
            "checksum": f"sha256:{digest}",
            "bytes": archive.stat().st_size,
            "checksum_source": "computed by the test",
            "no_checksum_because": "not needed: the checksum is given",
        }
    }
    config["data"]["extract"] = {"q.jsonl": {"archive": "archive.tar", "member": "questions.jsonl"}}
    config["data"]["questions"]["train"]["input"] = "resources/own/extracted/q.jsonl"
    config["data"]["questions"]["dev"]["index"] = "data/own/idx.json"
    config["pretrained"]["hub"] = {"model": HUB_MODEL}
    config["models"]["revisions"] = {HUB_MODEL: "main"}
    config["eval_reader_accelerations"] = {"prune1": {"keep_passages": 1}}  # its names
    config["distillation_signals"] = {"pdist": {"score_passages": {"mode": "pdist"}}}  # names
    config["resources"]["default"].update(
        slurm_partition="cpu",
        slurm_account="lab",
        qos="short",
        slurm_extra="--mail-type=END",
        constraint="intel",
    )
    return config


def _hostile_values(base: dict, workdir: Path):
    """(key path, hostile value, schema accepts it) for every string key: the payloads are
    tried from a different one for each key so that the accepted ones use them all."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    assert not list(validator.iter_errors(base)), "the base config itself must be valid"
    keys = string_keys()
    assert len(keys) >= 30, keys  # the walk found the schema's strings
    for n, path in enumerate(keys):
        ordinary = get(base, path)
        prefix = ordinary if isinstance(ordinary, str) else "x"
        tried = []
        for payload in PAYLOADS[n % len(PAYLOADS) :] + PAYLOADS[: n % len(PAYLOADS)]:
            value = prefix + payload.replace("MARK", f"{MARKER}-{n}")
            if not list(validator.iter_errors(put(base, path, value))):
                if ordinary and (workdir / str(ordinary)).is_file():
                    shutil.copy(workdir / ordinary, workdir / value)  # a path that exists
                yield path, value, True
                break
            tried.append(value)
        else:
            yield path, tried[0], False


def _markers(workdir: Path) -> list[str]:
    return sorted(str(p) for p in workdir.rglob(f"{MARKER}-*"))


def test_hostile_values_never_run(tmp_path):
    """Keys whose pattern refuses every payload name themselves in the DAG-time error; the
    values that pass are all put into one config that plans and runs cheap jobs cleanly."""
    base = _base_config(tmp_path)
    # the login node reaches a (loopback) hub that holds the config's hub models: the run
    # fetches them (report/config.yaml records their commits); the files are stand-ins
    hub = LoopbackHub()
    for name in (HUB_MODEL, base["models"]["reader"]):
        hub.add(name, {"config.json": b"{}", "model.safetensors": b"-", "tokenizer.json": b"{}"})
    online = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": None, "HF_HOME": str(tmp_path / "hf")}
    hostile, refused = base, []
    for path, value, accepted in _hostile_values(base, tmp_path):
        if accepted:
            hostile = put(hostile, path, value)
            continue
        refused.append(dotted(path))
        with pytest.raises(WorkflowError) as error:  # what rules/common.smk runs first
            validate(put(base, path, value), str(SCHEMA_FILE))
        # the error's "On instance['data']['downloads']..." names the key (or its mapping)
        named = "".join(f"[{key!r}]" for key in concrete(base, path))
        assert f"On instance{named}:" in str(error.value), (dotted(path), str(error.value))
    # paths, names, URLs, checksums, packages, SLURM options: all refused
    for key in ("run", "data.passages", "data.questions.dev.index", "data.extract.*.member",
                "data.downloads.*.url", "pretrained.*.package", "models.reader", "models.revisions.*",
                "resources.*.slurm_extra"):  # fmt: skip
        assert key in refused, key

    # one refusal at DAG time, from snakemake itself: nothing runs
    config = tmp_path / "refused.yaml"
    member = ("data", "extract", "*", "member")
    config.write_text(yaml.safe_dump(put(base, member, f"questions.jsonl$(touch {MARKER}-x)")))
    result = snakemake(tmp_path, *TARGETS, "--configfile", str(config), "--cores", "1")
    assert result.returncode != 0 and "On instance['data']['extract']['q.jsonl']['member']" in (
        result.stderr
    ), result.stderr[-3000:]
    assert not (tmp_path / "results").exists() and not _markers(tmp_path)

    # what passes: planned with its shell commands shown, then run
    config = tmp_path / "hostile.yaml"
    config.write_text(yaml.safe_dump(hostile))
    dry_run(tmp_path, *TARGETS, "--configfile", str(config))  # targets first (README.md)
    assert not _markers(tmp_path)
    result = snakemake(tmp_path, *TARGETS, "--configfile", str(config), "--cores", "1",
                       "--retries", "0", timeout=300, env=online)  # fmt: skip
    hub.close()
    assert not _markers(tmp_path), _markers(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert all((tmp_path / target).is_file() for target in TARGETS)
    assert (tmp_path / "resources/own/extracted/q.jsonl").is_file()  # download + extract ran
    assert len((tmp_path / TARGETS[1]).read_text().splitlines()) == 6  # dev: its index, cut


# Fields a shell command may hold unquoted: numbers and enums the schema or a wildcard
# constraint (rules/common.smk: i, k = \d+) has checked.
NUMBERS = {"threads", "wildcards.i", "wildcards.k", "params.shards"}
NUMBERS |= {
    f"resources.{key}"
    for key, spec in SCHEMA["$defs"]["resources"]["properties"].items()
    if spec.get("type") == "integer" or "enum" in spec
}


def test_every_shell_field_is_quoted_or_a_number(tmp_path):
    """Read from the rules as Snakemake loaded them (the demo, with one srun rule so that
    both launchers of rules/common.smk `fid()` are seen): `{params.member}` was not quoted."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["resources"]["train_reader"] = dict(
        mpi="srun", nodes=2, tasks_per_node=2, cpus_per_task=2, gres="gpu:2"
    )
    commands = rule_shell_commands(tmp_path, config)
    assert {"extract", "prepare_questions", "train_reader"} <= set(commands)
    assert "{resources.mpi}" in commands["train_reader"]
    unquoted = {
        (rule, field)
        for rule, command in commands.items()
        for field, spec in re.findall(r"\{([\w.]+)(:[^{}]*)?\}", command)
        if not spec.endswith("q") and field not in NUMBERS
    }
    assert not unquoted, unquoted


def test_absolute_input_paths(tmp_path):
    """Data on scratch space: absolute input paths plan; results stay under the workdir."""
    config = yaml.safe_load((ROOT / "config" / "own_data.yaml").read_text())
    squad = (SAMPLES / "squad-open-tiny").resolve()
    config["data"]["passages"] = str(squad / "psgs_w100.tsv")
    for split in ("train", "dev", "test"):
        config["data"]["questions"][split]["input"] = str(squad / "questions.jsonl")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    output = dry_run(tmp_path, "--configfile", str(tmp_path / "c.yaml"))
    assert f"--passages {squad / 'psgs_w100.tsv'}" in output
    assert re.search(f"--input {squad / 'questions.jsonl'} +--output results/own/data/dev", output)
    outputs = re.findall(r"^    output: (.*)$", output, flags=re.M)
    assert outputs and not [o for o in outputs if o.startswith("/")], outputs
