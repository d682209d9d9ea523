"""Memory: every training stage's plan (`fid plan-memory`) checked when the workflow loads, before
any job is queued; the training jobs' host memory requests (mem_mb) from their plans; and the
report's predicted against measured peak per trained model. The arithmetic is
workflow_scripts/memory_plans.py's; docs/memory.md "The workflow checks the plan" says why.

- `gpu_memory` (a workflow key, or `--config gpu_memory=...`, which the SLURM profile sets): the
  memory of one GPU of the training ranks. A stage on GPUs whose predicted peak per rank does not
  fit stops the workflow with the plan's table; unset, GPU stages are not checked. A stage on
  CPUs is checked against this machine's memory, where a local run's jobs run.
- mem_mb of train_reader and train_retriever: per job, from its plan and the size of its lists
  (a dry run shows <TBD> until they exist); the rule's own `resources` entry still wins.
- Only the two training commands have a plan (fid.memory.command_plans); scoring, evaluation
  and embedding keep their configured resources.

REQUIRED INPUTS: the config (its training sections, init sections, resources, gpu_memory).
OUTPUTS: none (no rules here; rules/memory_report.smk has the report's): the check, and
the functions that res() (rules/common.smk) and rule report_memory call.
"""

import dataclasses
import functools
import importlib.util
import os
import sys

import psutil

from fid.memory.sizes import parse_size
from fid.runtime.slurm_layout import gres_gpus


def _glue_module(name):
    """A module of workflow_scripts/ (the glue's folder, not a package), imported once."""
    if name not in sys.modules:
        path = Path(workflow.basedir) / "workflow_scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


memory_plans = _glue_module("memory_plans")
TRAINING_KINDS = {"train_reader": "reader", "train_retriever": "retriever"}
try:
    GPU_MEMORY = (
        parse_size(config["gpu_memory"], "gpu_memory")
        if config.get("gpu_memory")
        else None
    )
except ValueError as error:
    fail("gpu_memory", str(error), "e.g. gpu_memory: 80GiB")


def training_sections():
    """(rule, config section) of every training job of the config."""
    found = [("train_reader", "reader_warmup")] if CURRICULUM.get("warmup") else []
    for i in range(K):
        found += [
            (rule_name, stage_section(i, kind))
            for rule_name, kind in TRAINING_KINDS.items()
        ]
    found += [("train_retriever", f"retriever_signal_{name}") for name in SIGNALS]
    return list(dict.fromkeys(found))


def planned_shape(kind):
    """(where the shape comes from, --init-model) of the reader or retriever chain: every round
    has the shape of the chain's start; a model the workflow builds, from its init section.
    """
    flag = model_spec(kind)[0]
    if MODELS[kind] == "init":
        return {"init": kind, "knobs": STAGES[f"init_{kind}"][1]}, flag
    if "package" in PRETRAINED.get(MODELS[kind], {}):
        return {"package": PRETRAINED[MODELS[kind]]["package"]}, flag
    if MODELS[kind] in HUB_MODELS.values() and not Path(flag).is_dir():
        return {
            "name": MODELS[kind]
        }, flag  # not fetched yet: its shape by name (known models)
    return {"name": flag}, flag


def training_layout(rule_name):
    """(world size, ranks per node, device) of a training rule's jobs, as fid() launches them:
    GPUs when the job asks for some, or, without gres and srun, when this machine has some.
    """
    r = _configured(rule_name)
    if "mpi" in r:
        per_node = r["tasks_per_node"]
        world = r.get("nodes", 1) * per_node
    else:
        world = per_node = local_ranks(r.get("processes", 1))
    gpus = gres_gpus(r.get("gres"))[1] or ("mpi" not in r and visible_gpus())
    return world, per_node, "cuda" if gpus else "cpu"


@functools.cache
def training_job(rule_name, section):
    """The stage as memory_plans plans it, or None when the model's shape cannot be read here
    (a hub name neither known nor cached: fid downloads it when the job runs)."""
    shape, flag = planned_shape(TRAINING_KINDS[rule_name])
    world, per_node, device = training_layout(rule_name)
    job = memory_plans.TrainingJob(
        rule_name,
        section,
        STAGES[section][1],
        shape,
        flag,
        world,
        per_node,
        device,
        stage_file(section),
    )
    try:  # on a CPU the request needs the step's plan; on GPUs the weights' size
        memory_plans.plan(job) if device == "cpu" else memory_plans.weights(job)
    except memory_plans.PlanUnavailable as error:
        logging.getLogger("fid").warning(
            "%s, config section '%s': no memory plan (%s); its memory is not checked and its "
            "mem_mb is resources.default's",
            rule_name,
            section,
            error,
        )
        return None
    return job


def _planned_jobs(rule_name):
    if rule_name not in TRAINING_KINDS or "mem_mb" in config["resources"].get(
        rule_name, {}
    ):
        return []
    jobs = [training_job(r, s) for r, s in training_sections() if r == rule_name]
    return [job for job in jobs if job is not None]


def planned_request(rule_name):
    """{"mem_mb": ...} of a planned training rule without a mem_mb of its own; the largest of its
    stages' requests before their lists' sizes are known (the SLURM layout check reads it).
    """
    jobs = _planned_jobs(rule_name)
    if not jobs:
        return {}
    return {"mem_mb": max(memory_plans.host_mem_mb(job, 0) for job in jobs)}


def planned_mem_mb(rule_name):
    """{"mem_mb": a function of the job} for a planned training rule without a mem_mb of its own;
    its stage's request with the size of its training and dev lists (<TBD> until they exist).
    """
    if not _planned_jobs(rule_name):
        return {}

    def mem_mb(wildcards, input):
        job = training_job(rule_name, training_section(wildcards))
        if job is None:
            return _configured(rule_name).get("mem_mb")
        data = sum(os.path.getsize(path) for path in (input.train, input.dev))
        return memory_plans.host_mem_mb(job, data)

    return {"mem_mb": mem_mb}


# The check, when the workflow loads (dry runs too), in the process that plans and submits: a
# job process of a remote executor loads the workflow again and has nothing to decide.
if workflow.is_main_process:
    _problems = []
    for _rule, _section in training_sections():
        _job = training_job(_rule, _section)
        if _job is None:
            continue
        _error, _warning = memory_plans.check(
            _job, GPU_MEMORY, psutil.virtual_memory().total
        )
        _problems += [_error] if _error else []
        if _warning:
            logging.getLogger("fid").warning(_warning)
    if _problems:
        raise WorkflowError("\n\n".join(_problems))


# ---------------------------------------------------------------- the report
def trained_models():
    """Rule report_memory's params: {model folder under results/{run}/: {"job": its stage's
    TrainingJob fields (None: not planned), "mem_mb": the config's, if any, "benchmark": file}}.
    """
    # model -> (the rule its plan is of, its config section, its benchmark file's path)
    found = {}
    if CURRICULUM.get("warmup"):
        found["iter0/reader_warmup"] = (
            "train_reader",
            "reader_warmup",
            f"train_reader/{RUN}/iter0/reader_warmup",
        )
    for i in range(K):
        found[f"iter{i}/reader"] = (
            "train_reader",
            stage_section(i, "reader"),
            f"train_reader/{RUN}/iter{i}/reader",
        )
        found[f"iter{i}/retriever"] = (
            "train_retriever",
            stage_section(i, "retriever"),
            f"train_retriever/{RUN}/iter{i}",
        )
    # the retrievers of distillation_signals: rule train_retriever_signal (signals.smk)
    for source, name in SIGNAL_SOURCES.items():
        found[f"{source}/retriever"] = (
            "train_retriever",
            f"retriever_signal_{name}",
            f"train_retriever_signal/{RUN}/{source}",
        )
    models = {}
    for model, (rule_name, section, log) in found.items():
        job = training_job(rule_name, section)
        models[model] = {
            "job": dataclasses.asdict(job) if job else None,
            "mem_mb": config["resources"]
            .get(rule_name, {})
            .get("mem_mb"),  # the user's, if any
            "benchmark": f"logs/benchmarks/{log}.tsv",
        }
    return models
