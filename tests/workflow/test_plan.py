"""`snakemake -n` plans every shipped config completely: jobs per rule (shards x rounds,
splits), resources and launch lines per rule as configured; `--lint` and snakefmt are clean."""

from __future__ import annotations

import re
import shutil
import time

import pytest
import yaml
from workflow_helpers import (
    BIN,
    ROOT,
    SAMPLES,
    dry_run,
    job_counts,
    planned_jobs,
    rule_shell_commands,
    snakemake,
)


def expected_counts(cfg: dict) -> dict[str, int]:
    """Jobs per rule that a fresh plan of `cfg` must hold (the DAG's arithmetic)."""
    k, shards, splits = cfg["rounds"], cfg["shards"], len(cfg["eval_splits"])
    compare = [c for c in cfg.get("compare", []) if c != "bm25"]
    signals = len(cfg.get("distillation_signals") or {})  # each scored in the last round ...
    seeds = signals * cfg.get("distillation_seeds", 3)  # ... and a retriever per seed
    dense = k + len(compare) + seeds  # retrievers that embed, index and search the passages
    bm25_shards = (cfg.get("bm25") or {}).get("shards", 1)
    counts = {
        "train_reader": k + bool((cfg["data"].get("curriculum") or {}).get("warmup")),
        "score_passages": 2 * k,  # train + dev lists of every round
        "train_retriever": k,
        "embed_passages": shards * dense,
        "build_index": dense,
        # iter0..iter{K-2} retrieve train, dev and test for the next round; the last round's
        # retriever and the comparisons only the evaluated splits
        "retrieve": 3 * (k - 1) + splits * (1 + len(compare) + seeds),
        # bm25.shards = S > 1: the statistics, S shard builds, S searches and a merge per split
        "retrieve_bm25": 3 * (bm25_shards == 1),
        "build_bm25": int(bm25_shards == 1),
        "bm25_stats": int(bm25_shards > 1),
        "build_bm25_shard": bm25_shards * (bm25_shards > 1),
        "retrieve_bm25_shard": 3 * bm25_shards * (bm25_shards > 1),
        "merge_bm25": 3 * (bm25_shards > 1),
        "eval_reader": k * splits,
        "eval_retrieval": (1 + k + len(compare)) * splits,
        "eval_baseline": splits,
        "eval_reader_fast": k * splits * len(cfg.get("eval_reader_accelerations") or {}),
        "report_acceleration": int(bool(cfg.get("eval_reader_accelerations"))),
        "score_passages_signal": 2 * signals,
        "train_retriever_signal": seeds,
        "report_signals": int(bool(signals)),
    }
    counts["build_passage_store"] = int(cfg.get("list_format") == "compact")
    if cfg["data"]["source"] == "demo":
        curriculum = cfg["data"].get("curriculum") or {}
        counts["make_demo_data"] = 2 if curriculum.get("warmup") else 1
        counts["make_reader_lists"] = 2 * (curriculum.get("round0_lists") == "gold_forced")
    elif cfg["data"]["source"] == "scale":
        counts["make_scale_data"] = 1
    else:
        counts["download"] = len(cfg["data"].get("downloads", {}))
        counts["extract"] = len(cfg["data"].get("extract", {}))
        counts["prepare_questions"] = 3
    return counts


@pytest.mark.parametrize("name", ["config.yaml", "nq.yaml", "tqa.yaml", "scale.yaml"])
def test_plan_counts(tmp_path, name):
    cfg = yaml.safe_load((ROOT / "config" / name).read_text())
    started = time.perf_counter()
    output = dry_run(tmp_path, "--configfile", str(ROOT / "config" / name))
    print(f"{name}: planned in {time.perf_counter() - started:.1f} s")
    counts = job_counts(output)
    for rule, count in expected_counts(cfg).items():
        assert counts.get(rule, 0) == count, (rule, counts)
    jobs = planned_jobs(output)
    shards = {j["wildcards"]["k"] for j in jobs if j["rule"] == "embed_passages"}
    assert shards == {str(k) for k in range(cfg["shards"])}


def test_demo_resources_and_threads(tmp_path):
    want = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["resources"]
    jobs = planned_jobs(dry_run(tmp_path))
    for rule in ("train_reader", "train_retriever", "score_passages"):
        for job in (j for j in jobs if j["rule"] == rule):
            # the training jobs' memory comes from their plans (rules/memory.smk), known once
            # their lists exist; an explicit mem_mb would win
            planned = rule.startswith("train_") and "mem_mb" not in want[rule]
            assert job["resources"]["mem_mb"] == ("<TBD>" if planned else str(want[rule]["mem_mb"]))
            assert job["resources"]["runtime"] == str(want[rule]["runtime"])
            # 2 local ranks (torchrun), 1 torch thread each: the job holds 2 cores
            assert job["threads"] == want[rule]["threads"] == 2
            assert (
                "torchrun --standalone --nproc-per-node=2 --log-dir=/dev/null -m fid --threads 1"
                f" --log-file logs/{rule}/" in job["shell"]
            )
    for job in (j for j in jobs if j["rule"] == "eval_reader"):
        assert job["threads"] == 1
        assert "fid --threads 1 --log-file logs/eval_reader/demo/" in job["shell"]
    assert all("srun" not in j["shell"] for j in jobs if j["shell"])


@pytest.mark.parametrize("name", ["nq.yaml", "tqa.yaml"])
def test_gpu_layout_per_rule(tmp_path, name):
    cfg = yaml.safe_load((ROOT / "config" / name).read_text())
    jobs = planned_jobs(dry_run(tmp_path, "--configfile", str(ROOT / "config" / name)))
    for rule, want in cfg["resources"].items():
        planned = [j for j in jobs if j["rule"] == rule]
        if rule == "default" or not planned:
            continue
        for job in planned:
            for key, value in want.items():
                if key == "threads":
                    assert job["threads"] == value, (rule, job)
                elif key in ("signal_lead_s", "requeue_on_stop", "max_requeues"):  # the workflow's
                    assert key not in job["resources"], (rule, key)
                else:
                    assert job["resources"][key] == str(value), (rule, key, job["resources"])
            if "mpi" in want:
                # every rank sees its node's GPUs (no --gpus-per-task: NVLink between ranks);
                # training ranks learn the stop signal's lead and whether to requeue
                exports = (
                    f" --export=ALL,FID_SIGNAL_LEAD_S={want['signal_lead_s']},FID_SLURM_REQUEUE=1"
                    if rule.startswith("train_") else ""
                )  # fmt: skip
                layout = (
                    f"srun --nodes={want['nodes']} --ntasks-per-node={want['tasks_per_node']} "
                    f"--cpus-per-task={want['cpus_per_task']} --kill-on-bad-exit=1{exports} "
                    f"fid --threads {want['cpus_per_task']} --log-file logs/"
                )
                assert layout in job["shell"], job["shell"]
                assert "--gpus-per-task" not in job["shell"]
                assert job["threads"] == want["cpus_per_task"]
            elif "gres" in want:  # a one-GPU job: one plain process, its threads from config
                assert "srun" not in job["shell"], job["shell"]
                assert f"fid --threads {want['threads']} --log-file logs/{rule}/" in job["shell"]
    # state of training jobs: a params path, never an output
    train = next(j for j in jobs if j["rule"] == "train_reader")
    assert re.search(
        r"--state-root state/\S+/iter0/reader( --passages \S+)?\s*$", train["shell"]
    ), train["shell"]


def test_distillation_signals_run_as_the_rounds_own_jobs(tmp_path):
    """distillation_signals on nq.yaml: each signal's chain in the last round; its scoring and
    training jobs take score_passages' and train_retriever's resources and srun layout, read
    the round's lists and reader, and start the retriever where the round's own starts."""
    from workflow_helpers import write_config

    signals = {"pdist": {"score_passages": {"mode": "pdist"}}, "loop": {"score_passages": {"mode": "loop"}}}  # fmt: skip
    nq = ROOT / "config" / "nq.yaml"
    config = write_config(tmp_path / "c.yaml", nq, distillation_signals=signals)
    assert "distillation_seeds" not in yaml.safe_load(config.read_text())  # the default: 3
    cfg = yaml.safe_load(config.read_text())
    output = dry_run(tmp_path, "--configfile", str(config))
    counts = job_counts(output)
    for rule, count in expected_counts(cfg).items():
        assert counts.get(rule, 0) == count, (rule, counts)
    jobs = planned_jobs(output)
    last = str(cfg["rounds"] - 1)
    for rule, own_rule in (("score_passages_signal", "score_passages"),
                           ("train_retriever_signal", "train_retriever")):  # fmt: skip
        mine = [j for j in jobs if j["rule"] == rule]
        assert mine and {j["wildcards"]["signal"] for j in mine} == set(signals)
        for job in mine:
            name, split = job["wildcards"]["signal"], job["wildcards"].get("split")
            own = next(j for j in jobs if j["rule"] == own_rule and j["wildcards"]["i"] == last
                       and j["wildcards"].get("split") == split)  # fmt: skip
            assert job["wildcards"]["i"] == last
            assert job["resources"] == own["resources"] and job["threads"] == own["threads"]
            launcher = own["shell"].split(" --log-file")[0]
            assert job["shell"].startswith(launcher + " --log-file"), job["shell"]
            assert "srun --nodes=" in launcher
            stage = "score_passages" if rule == "score_passages_signal" else "retriever"
            seed = f"_seed{job['wildcards']['seed']}" if stage == "retriever" else ""
            assert (
                f"--config results/{cfg['run']}/config/{stage}_signal_{name}{seed}.yaml"
                in job["shell"]
            )
            flag = "--questions" if stage == "score_passages" else "--init-model"
            value = re.search(rf"{flag} (\S+)", own["shell"]).group(1)
            assert f"{flag} {value}" in job["shell"], (flag, job["shell"])


def test_distillation_signals_train_a_retriever_per_seed(tmp_path):
    """Issue 49.5: each signal scores once and trains distillation_seeds retrievers (3 by
    default), each with its stage file's seed (the signal's retriever seed + 0, 1, ...), its
    own source, embeddings, index and lists; the report reads them all."""
    from workflow_helpers import write_config

    signals = {"uniform": {"score_passages": {"mode": "uniform"}},
               "in_batch": {"score_passages": {"mode": "uniform"},
                            "retriever": {"train_n_passages": 1, "in_batch_negatives": True,
                                          "seed": 5}}}  # fmt: skip
    demo = ROOT / "config" / "config.yaml"
    for seeds in (None, 2):
        config = write_config(tmp_path / "c.yaml", demo, distillation_signals=signals,
                              distillation_seeds=seeds)  # fmt: skip
        output = dry_run(tmp_path, "--configfile", str(config))
        jobs, n = planned_jobs(output), seeds or 3
        trained = {(j["wildcards"]["signal"], j["wildcards"]["seed"])
                   for j in jobs if j["rule"] == "train_retriever_signal"}  # fmt: skip
        assert trained == {(name, str(s)) for name in signals for s in range(n)}
        scored = [j for j in jobs if j["rule"] == "score_passages_signal"]
        assert len(scored) == 2 * len(signals)  # train and dev, once per signal
        sources = {j["wildcards"]["source"] for j in jobs if j["rule"] == "build_index"}
        assert {s for s in sources if "-" in s} == {f"iter1-{name}-seed{s}" for name, s in trained}
        searched = [
            j for j in jobs if j["rule"] == "retrieve" and "-seed" in j["wildcards"]["source"]
        ]
        assert len(searched) == 2 * len(signals) * n  # dev, test: what report_signals reads
        # the disk plan: a signal's scores once, each seed's retriever (and the round's own)
        plan = output.split("disk plan", 1)[1]
        for name in signals:
            assert plan.count(f"iter1-{name} scores") == 1
            for s in range(n):
                assert f"iter1-{name}-seed{s}/retriever model" in plan
        assert "iter1/retriever model" in plan
    # the stage files' seeds: each training job's config, written by its stage_config job
    result = snakemake(tmp_path, "--configfile", str(config), "--cores", "1",
                       *(f"results/demo/config/retriever_signal_{name}_seed{s}.yaml"
                         for name in signals for s in range(2)))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    for name, start in (("uniform", 0), ("in_batch", 5)):
        for s in range(2):
            path = tmp_path / f"results/demo/config/retriever_signal_{name}_seed{s}.yaml"
            knobs = yaml.safe_load(path.read_text())
            assert knobs["seed"] == start + s
            assert knobs.get("train_n_passages") == (1 if name == "in_batch" else None)


def test_own_data_plans(tmp_path):
    data = tmp_path / "data" / "own"
    data.mkdir(parents=True)
    squad = SAMPLES / "squad-open-tiny"
    shutil.copy(squad / "psgs_w100.tsv", data / "psgs_w100.tsv")
    shutil.copy(squad / "questions.jsonl", data / "questions.jsonl")
    cfg = yaml.safe_load((ROOT / "config" / "own_data.yaml").read_text())
    counts = job_counts(dry_run(tmp_path, "--configfile", str(ROOT / "config" / "own_data.yaml")))
    for rule, count in expected_counts(cfg).items():
        assert counts.get(rule, 0) == count, (rule, counts)


def test_lint_is_clean(tmp_path):
    result = snakemake(tmp_path, "--lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations" in result.stdout + result.stderr


def test_snakefmt_is_clean():
    import subprocess

    files = [str(ROOT / "Snakefile"), *map(str, sorted((ROOT / "rules").glob("*.smk")))]
    result = subprocess.run(
        [str(BIN / "snakefmt"), "--check", *files], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dag_and_rulegraph_render(tmp_path):
    if shutil.which("dot") is None:
        pytest.skip("graphviz (dot) is not installed")
    import subprocess

    for kind in ("--rulegraph", "--dag"):
        graph = snakemake(tmp_path, kind)
        assert graph.returncode == 0, graph.stderr
        svg = subprocess.run(
            ["dot", "-Tsvg"], input=graph.stdout, capture_output=True, text=True, check=False
        )
        assert svg.returncode == 0 and "<svg" in svg.stdout, svg.stderr


def test_gold_forced_curriculum_plans(tmp_path):
    from workflow_helpers import write_config

    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["data"]
    data["curriculum"]["round0_lists"] = "gold_forced"
    config = write_config(tmp_path / "c.yaml", ROOT / "config" / "config.yaml", data=data)
    cfg = yaml.safe_load(config.read_text())
    output = dry_run(tmp_path, "--configfile", str(config))
    counts = job_counts(output)
    for rule, count in expected_counts(cfg).items():
        assert counts.get(rule, 0) == count, (rule, counts)
    reader0 = next(
        j for j in planned_jobs(output)
        if j["rule"] == "train_reader" and j["wildcards"] == {"run": "demo", "i": "0", "stage": "reader"}
    )  # fmt: skip
    assert "--train results/demo/iter0/reader_lists/train.json" in reader0["shell"]


# The three launchers of rules/common.smk `fid()`: srun tasks, local torchrun ranks, a process.
_LAUNCHER = (
    r"(\{resources\.mpi\} --nodes=\{resources\.nodes\} [^;&|`$]*? fid --threads "
    r"\{resources\.cpus_per_task\}"
    r"|torchrun --standalone --nproc-per-node=\d+ --log-dir=/dev/null -m fid --threads \d+"
    r"|fid --threads \{threads\}) --log-file \{log:q\}"
)


def test_every_rule_is_one_fid_call(tmp_path):
    """Each rule's shell is one `fid <verb>` of the rule's own name (rule train_reader runs
    `fid train-reader`, whose handler is fid.cli.commands.train_reader), launched the one
    way rules/common.smk says, logging to the rule's log: no glue, no second command."""
    from fid.cli import commands
    from fid.cli.parser import build_parser

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["resources"]["train_reader"] = dict(
        mpi="srun", nodes=2, tasks_per_node=2, cpus_per_task=2, gres="gpu:2"
    )
    shells = rule_shell_commands(tmp_path, config)
    verbs = set(build_parser()._subparsers._group_actions[0].choices)
    assert {"train_reader", "train_retriever", "copy_packaged_model", "retrieve"} <= set(shells)
    for rule, shell in shells.items():
        # eval-reader again with an acceleration's stage config; a distillation signal's
        # score-passages and train-retriever with its own (rules/common.smk RESOURCES_OF)
        rule = {"eval_reader_fast": "eval_reader", "score_passages_signal": "score_passages",
                "train_retriever_signal": "train_retriever"}.get(rule, rule)  # fmt: skip
        verb = rule.replace("_", "-")
        # the whole log in the rule's log file, by fid itself: nothing redirected; the fetch
        # of a hub model alone with the hub setting Snakemake was started with (every other
        # job inherits HF_HUB_OFFLINE=1)
        offline = r"HF_HUB_OFFLINE=[01] " if rule == "fetch_model" else ""
        pattern = rf"{offline}{_LAUNCHER} {verb} [^;&|`$<>]*"
        assert re.fullmatch(pattern, shell.strip()), (rule, shell)
        assert verb in verbs and callable(getattr(commands, rule)), rule


def test_local_ranks_leave_no_torchrun_folders(tmp_path):
    """torchrun keeps a log folder per run (/tmp/torchelastic_*) and never removes it: the
    workflow's launcher of local ranks asks it for none (its ranks log through fid)."""
    import os
    import subprocess

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    shell = rule_shell_commands(tmp_path, config)["train_reader"]
    launcher = shell.split(" -m fid ")[0]
    assert launcher.startswith("torchrun --standalone") and "--log-dir=/dev/null" in launcher
    for name, argv in {"ours": launcher.split(), "plain": ["torchrun", "--standalone",
                       "--nproc-per-node=2"]}.items():  # fmt: skip
        tmp = tmp_path / name
        tmp.mkdir()
        env = {**os.environ, "TMPDIR": str(tmp), "PATH": f"{BIN}:{os.environ['PATH']}"}
        run = subprocess.run([*argv, "-m", "fid", "--help"], capture_output=True, text=True,
                             env=env, timeout=300)  # fmt: skip
        assert run.returncode == 0 and "usage: fid" in run.stdout, run.stderr[-2000:]
        left = list(tmp.glob("torchelastic_*"))
        assert left == [] if name == "ours" else left, (name, left)  # plain torchrun leaves one


@pytest.mark.parametrize(
    "visible, launcher",
    [
        ("", "torchrun --standalone --nproc-per-node=2 --log-dir=/dev/null -m fid --threads 1"),
        ("0", "fid --threads 2 --log-file"),  # one GPU: one rank (two would share it)
        ("0,1", "torchrun --standalone --nproc-per-node=2 --log-dir=/dev/null -m fid"),
        ("0,1,2,3", "torchrun --standalone --nproc-per-node=2 --log-dir=/dev/null -m fid"),
    ],
)
def test_the_demos_local_ranks_fit_the_gpus(tmp_path, monkeypatch, visible, launcher):
    """`processes: 2` runs 2 ranks on CPUs, at most one per GPU where GPUs are visible (fid
    refuses two ranks on one GPU), so `make demo` runs on a one-GPU machine."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    jobs = planned_jobs(dry_run(tmp_path))
    for job in (j for j in jobs if j["rule"] in ("train_reader", "train_retriever")):
        assert job["shell"].startswith(launcher), job["shell"]


class _JobResources(dict):
    """A planned job's resources as the SLURM plugin reads them (`.get`, attributes; numbers
    as numbers)."""

    def __getattr__(self, name):
        return self[name]


def sbatch_line(job: dict, **settings) -> str:
    """The sbatch command line snakemake-executor-plugin-slurm builds for a planned job, with
    its own functions (what Executor.run_job calls, in that order)."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    resources = _JobResources(
        {k: int(v) if v.isdigit() else v for k, v in job["resources"].items()}
    )
    planned = SimpleNamespace(resources=resources, threads=job["threads"])
    validate_slurm_extra(planned)
    partition = resources.get("slurm_partition")
    params = dict(
        run_uuid="RUN", slurm_logfile=f"logs/slurm/rule_{job['rule']}/%j.log",
        comment_str=f"rule_{job['rule']}", account="",
        partition=f"-p {partition}" if partition else "", workdir="",
    )  # fmt: skip
    options = dict(requeue=True, no_requeue=False, qos=None, reservation=None, **settings)
    return get_submit_command(planned, params, SimpleNamespace(**options)) + set_gres_string(
        planned
    )


def test_sbatch_and_srun_lines_carry_the_site_keys_and_the_stop_signal(tmp_path):
    """nq.yaml's train_reader as the SLURM plugin submits it (its own functions): partition,
    QoS, account, GPU type and the stop signal from the config, logs appended across
    requeues; the srun line keeps every GPU of a node visible to its ranks."""
    config = yaml.safe_load((ROOT / "config" / "nq.yaml").read_text())
    config["resources"]["train_reader"].update(
        qos="long", slurm_account="proj42", gres="gpu:h100.80gb:8", signal_lead_s=900,
        requeue_on_stop=False, max_requeues=5,
        mem_mb=480000,  # explicit: the plan's request would be <TBD>
    )  # fmt: skip
    path = tmp_path / "nq.yaml"
    path.write_text(yaml.safe_dump(config))
    jobs = planned_jobs(dry_run(tmp_path, "--configfile", str(path)))
    train = next(j for j in jobs if j["rule"] == "train_reader")
    line = sbatch_line(train)
    print(f"\nsbatch: {line}\nsrun: {train['shell'][: train['shell'].index(' train-reader')]}")
    for option in ("-p gpu", "--qos=long", "-t 2880", "--mem 480000", "--nodes=8", "--requeue",
                   "--ntasks-per-node=8", "--cpus-per-task=8", "--signal=USR1@900",
                   "--open-mode=append", "--gres=gpu:h100.80gb:8"):  # fmt: skip
        assert f" {option}" in f"{line} ", (option, line)
    assert train["resources"]["slurm_account"] == "proj42"
    assert "--gpus-per-task" not in train["shell"]
    assert (" --export=ALL,FID_SIGNAL_LEAD_S=900,FID_SLURM_REQUEUE=0,FID_SLURM_MAX_REQUEUES=5 "
            "fid ") in train["shell"]  # fmt: skip
    # a rule that is no training job gets no signal; every job appends to its SLURM log
    score = next(j for j in jobs if j["rule"] == "score_passages")
    assert "--signal" not in sbatch_line(score) and "--open-mode=append" in sbatch_line(score)
    assert "FID_SIGNAL_LEAD_S" not in score["shell"]


def test_an_exported_master_port_reaches_no_job(tmp_path):
    """A FID_MASTER_PORT exported where Snakemake runs reached every job it submitted (sbatch
    passes the environment on): concurrent jobs on a node collided on the one port (issue
    45.6). The workflow drops it, saying so, and each job derives its own from its job id."""
    result = snakemake(tmp_path, "-n", "--cores", "1", env={"FID_MASTER_PORT": "4000"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "FID_MASTER_PORT=4000 is not passed on to the workflow's jobs" in output
