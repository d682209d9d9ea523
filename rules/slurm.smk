"""SLURM: what the config's `resources` become on a cluster, checked before anything runs.

- Training rules launched as srun tasks (`mpi: srun`) get SIGUSR1 `signal_lead_s` seconds
  before their time limit (sbatch --signal=USR1@N, sent to the job's steps, the fid ranks:
  not B:, which would reach only the batch shell, Snakemake's job step, and kill it); fid
  stops at the end of its step with a checkpoint and, with `requeue_on_stop` (the default),
  requeues its own job, which starts again with a fresh time limit and resumes (at most
  `max_requeues` times, and never after a SIGTERM: scancel, preemption, the limit itself).
- Every job's SLURM log is appended to (--open-mode=append): a requeued job keeps its first
  attempt's output.
- The plugin's job-status polls reviewed (fid.runtime.slurm_status): a job preempted under
  PreemptMode=CANCEL, or pending on a per-job limit, is a failure Snakemake sees (and retries);
  a shared QOS/association limit is named in a warning; sacct only where accounting exists.
- Config-time checks of the SLURM keys (the plugin's own rules for slurm_extra, one rank per
  GPU); at start, with the SLURM executor, each GPU job's layout against its partition
  (fid.runtime.slurm_layout), before anything is submitted.
"""

import os
import subprocess

from fid.runtime.slurm_layout import (
    gres_gpus,
    layout_of,
    layouts_refused,
    read_partitions,
)
from fid.runtime.slurm_status import install as install_status_review

TRAINING_RULES = ("train_reader", "train_retriever")
SIGNAL_LEAD_S = (
    600  # default: a t5-base step + dev evaluation + a ~3 GB checkpoint, with room
)
# what the plugin sets itself (refused in slurm_extra at every submission), and ours
SLURM_EXTRA_OWNED = {
    "--signal": "signal_lead_s",
    "--open-mode": "(set by the workflow: logs are appended)",
}
WORKFLOW_ONLY_KEYS = (
    "threads",
    "processes",
    "signal_lead_s",
    "requeue_on_stop",
    "max_requeues",
)


# Each job derives its own rendezvous port from its job id (fid.runtime.launcher.slurm_port);
# a FID_MASTER_PORT exported in the shell that runs Snakemake would reach every job it submits
# (sbatch passes the environment on), and concurrent jobs on one node would collide on it.
if "FID_MASTER_PORT" in os.environ:
    logging.getLogger("fid").warning(
        "FID_MASTER_PORT=%s is not passed on to the workflow's jobs: each derives its own "
        "port from its SLURM job id",
        os.environ.pop("FID_MASTER_PORT"),
    )


def check_slurm_keys(rule_name, spec, merged):
    """One rule's SLURM keys (`spec` its own entry, `merged` over resources.default)."""
    key = f"resources.{rule_name}"
    for flag in ("signal_lead_s", "requeue_on_stop", "max_requeues"):
        if flag in spec and rule_name not in (*TRAINING_RULES, "default"):
            fail(f"{key}.{flag}", "only training jobs stop on a signal", "remove it")
        if flag in spec and rule_name in TRAINING_RULES and "mpi" not in merged:
            fail(
                f"{key}.{flag}",
                "the signal reaches fid only when its ranks are srun tasks (`mpi: srun`); "
                "a job without, SLURM's signal would kill Snakemake's job step first",
                "give the job mpi = srun (with nodes, tasks_per_node, cpus_per_task), or "
                "remove the key",
            )
    lead = merged.get("signal_lead_s", SIGNAL_LEAD_S)
    if (
        rule_name in TRAINING_RULES
        and "mpi" in merged
        and lead >= 60 * merged.get("runtime", 0)
    ):
        fail(
            f"{key}.signal_lead_s",
            f"a stop signal {lead} s before the end of a {merged.get('runtime')}-minute job "
            "comes before it starts",
            "raise runtime, or lower signal_lead_s",
        )
    _, gpus = gres_gpus(merged.get("gres"))
    if "mpi" in merged and gpus and merged.get("tasks_per_node") != gpus:
        fail(
            f"{key}.tasks_per_node",
            f"{merged.get('tasks_per_node')} ranks per node for {gpus} GPUs per node "
            f"(gres {merged['gres']!r}): fid runs one rank per GPU",
            f"set tasks_per_node: {gpus}, or gres to gpu:{merged.get('tasks_per_node')}",
        )
    extra = merged.get("slurm_extra", "")
    for flag, instead in SLURM_EXTRA_OWNED.items():
        if re.search(rf"(^| ){flag}(=| |$)", extra):
            fail(f"{key}.slurm_extra", f"{flag} has its own key", f"use {instead}")
    try:
        from snakemake_executor_plugin_slurm.validation import (
            get_forbidden_slurm_options,
        )
    except ImportError:  # no SLURM plugin installed: nothing submits, nothing to check
        return
    for pattern, option in get_forbidden_slurm_options().items():
        if re.search(pattern, extra):
            fail(
                f"{key}.slurm_extra",
                f"the SLURM plugin sets the {option} itself and refuses it here",
                "use the key for it: slurm_partition, slurm_account, qos, runtime, mem_mb, "
                "nodes, tasks_per_node, cpus_per_task, threads, gres, constraint",
            )


for _rule, _spec in config["resources"].items():
    check_slurm_keys(_rule, _spec, {**config["resources"]["default"], **_spec})


def signal_lead(rule_name):
    """Seconds before its time limit that a SLURM job of `rule_name` is sent SIGUSR1 (0: never)."""
    r = _resources(rule_name)
    if rule_name not in TRAINING_RULES or "mpi" not in r:
        return 0
    return r.get("signal_lead_s", SIGNAL_LEAD_S)


def slurm_extra(rule_name):
    """sbatch options beyond the plugin's keys: the config's, the stop signal, appended logs."""
    r = _resources(rule_name)
    extra = [r["slurm_extra"]] if r.get("slurm_extra") else []
    lead = signal_lead(rule_name)
    if lead:
        extra.append(f"--signal=USR1@{lead}")
    extra.append("--open-mode=append")
    return " ".join(extra)


def srun_exports(rule_name):
    """What fid's ranks learn of the stop through the environment (srun --export)."""
    lead = signal_lead(rule_name)
    if not lead:
        return ""
    r = _resources(rule_name)
    requeue = int(r.get("requeue_on_stop", True))
    exports = f" --export=ALL,FID_SIGNAL_LEAD_S={lead},FID_SLURM_REQUEUE={requeue}"
    if "max_requeues" in r:  # else fid's own bound (fid.runtime.slurm_job)
        exports += f",FID_SLURM_MAX_REQUEUES={r['max_requeues']}"
    return exports


def check_layouts_against_partitions(refuse=True):
    """With the SLURM executor: every job about to be submitted fits its partition's nodes
    (CPUs, memory, GPUs and their type, node count, MaxTime), else one error naming the rule
    and the numbers, before the first submission (`slurm_preflight: warn`: a warning only, for
    a cluster the check reads wrong). Where sinfo cannot be asked, a warning.
    """
    plugin = workflow.executor_plugin
    if plugin is None or plugin.name != "slurm" or not workflow.is_main_process:
        return
    try:
        groups = read_partitions()
    except (OSError, subprocess.SubprocessError) as error:
        logging.getLogger("fid").warning(
            "could not ask sinfo for the partitions (%s): job layouts unchecked", error
        )
        return
    jobs = {}
    for job in workflow.dag.needrun_jobs():
        jobs.setdefault(job.rule.name, []).append(job)
    layouts = [
        layout_of(name, _request_with_data(name, jobs[name]))
        for name in sorted(set(jobs) - set(workflow._localrules))
    ]
    refused = layouts_refused(layouts, groups)
    if refused and refuse:
        raise WorkflowError(
            f"{refused[0]}; nothing was submitted. Hint: fix that rule's resources (or "
            "resources.default) in the config, or name another slurm_partition; "
            "slurm_preflight: warn runs anyway"
        )
    for message in refused:
        logging.getLogger("fid").warning(
            "%s (slurm_preflight: warn: submitted anyway)", message
        )


def _request_with_data(rule_name, jobs):
    """The rule's resources, a planned training rule's mem_mb with the data-dependent part of
    its request where its lists exist already (the largest of its jobs'; a list still to be
    made counts as empty, the plan's floor)."""
    r = _resources(rule_name)
    mem_mb = planned_mem_mb(rule_name).get("mem_mb")
    if mem_mb is None:
        return r
    known = []
    for job in jobs:
        try:
            known.append(mem_mb(job.wildcards, job.input))
        except OSError:  # an input this run makes: its size is not known yet
            continue
    return {**r, "mem_mb": max([r.get("mem_mb", 0), *known])}


def review_slurm_job_states():
    """With the SLURM executor: the plugin's status polls reviewed (fid.runtime.slurm_status),
    so that a job that ended preempted, or waits on a limit that never lifts, is not taken for
    a running one."""
    plugin = workflow.executor_plugin
    if plugin is None or plugin.name != "slurm" or not workflow.is_main_process:
        return
    import snakemake_executor_plugin_slurm

    install_status_review(snakemake_executor_plugin_slurm, workflow.executor_settings)
