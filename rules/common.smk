"""Configuration: validated once at DAG time, then turned into paths, resources and launchers.

REQUIRED INPUTS: the config (config/config.yaml or --configfile), config/config.schema.yaml.
OUTPUTS: none (no rules here): STAGES, path functions, per-rule resources and launchers, and
the input functions of the training rules, for rules/*.smk.
"""

import dataclasses
import json
import logging
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger as snakemake_logger
from snakemake_interface_logger_plugins.common import LogEvent
from snakemake.utils import validate

from fid.config import BM25Config
from fid.config import ConfigError, check_unique_keys, config_from_dict
from fid.config import EmbedPassagesConfig, EvalReaderConfig, EvalRetrievalConfig
from fid.config import InitReaderConfig, InitRetrieverConfig, ReaderTrainConfig
from fid.config import RetrieveConfig, RetrieverTrainConfig, ScorePassagesConfig
from fid.config import SCORE_MODES, reader_temperature_for
from fid.config import DemoDataConfig, ScaleDataConfig
from fid.config import DownloadConfig
from fid.config import IndexConfig
from fid.config import PrepareQuestionsConfig, ReaderListsConfig
from fid.evaluation.run_system import lists_source
from fid.data.download import DownloadError, check_existing_download
from fid.models.hub_fetch import RECORD as HUB_RECORD, fetchable, folder_name
from fid.models.hub_fetch import take_jobs_offline
from fid.runtime.gpus import visible_gpus

# Snakemake's loader keeps the last of a key given twice: a signal named twice ran the second.
for _file in workflow.configfiles:
    try:
        check_unique_keys(_file)
    except ConfigError as error:
        raise WorkflowError(str(error)) from None
validate(config, schema="../config/config.schema.yaml")


class NoShellCommandOfScripts(logging.Filter):
    """Snakemake 9 prints "Shell command: None" under --printshellcmds for every `script:` job
    (the report's and stage configs': snakemake/snakemake#3653). Only that record is dropped;
    every real shell command and every other message is printed as before."""

    def filter(self, record):
        return not (
            getattr(record, "event", None) == LogEvent.SHELLCMD
            and "shellcmd" in record.__dict__
            and record.shellcmd is None
        )


snakemake_logger.addFilter(NoShellCommandOfScripts())

RUN, DATASET, K, SHARDS = (config[k] for k in ("run", "dataset", "rounds", "shards"))
DATA, MODELS, CURRICULUM = (
    config["data"],
    config["models"],
    config["data"].get("curriculum"),
)
DEMO, CURRICULUM = DATA["source"] == "demo", CURRICULUM or {}
# the NQ-shaped rehearsal set of `fid make-scale-data`
SCALE = DATA["source"] == "scale"
COMPACT = config.get("list_format", "fid_json") == "compact"
PRETRAINED, COMPARE = config.get("pretrained") or {}, config.get("compare") or []
FIRST, EVAL_SPLITS = config["first_retrieval"], config["eval_splits"]
# Teacher signals compared in the last round, by name (rules/signals.smk): each scores once,
# results/{run}/iter{K-1}-{name}/scores/, and trains a retriever per seed of distillation_seeds
# (its retriever seed + 0, 1, ...), a retrieval source each: iter{K-1}-{name}-seed{s}
SIGNALS, SIGNAL_ROUND = config.get("distillation_signals") or {}, K - 1
SIGNAL_SEEDS = range(config.get("distillation_seeds", 3))
SIGNAL_SOURCES = {
    f"iter{SIGNAL_ROUND}-{name}-seed{s}": name for name in SIGNALS for s in SIGNAL_SEEDS
}
# the stage of that round's own retriever, which every signal's knobs go over
OWN_RETRIEVER = "retriever_later" if SIGNAL_ROUND > 0 else "retriever"
DENSE = list(PRETRAINED) + [f"iter{i}" for i in range(K)]  # sources that embed
DENSE += list(SIGNAL_SOURCES)
SOURCES = list(dict.fromkeys([FIRST, *(f"iter{i}" for i in range(K)), *COMPARE]))
DOWNLOADS, EXTRACTS = DATA.get("downloads") or {}, DATA.get("extract") or {}


def fail(key, problem, hint):
    raise WorkflowError(f"config key '{key}': {problem}. Hint: {hint}")


def section(name, later=False):
    """A stage section; for rounds >= 1 with `later_rounds.{name}` merged over it."""
    over = (config.get("later_rounds") or {}).get(name) if later else None
    return {**(config.get(name) or {}), **(over or {})}


# Stage sections: file stem -> (dataclass of the fid subcommand, knobs).
STAGES = {
    "bm25": (BM25Config, section("bm25")),
    "init_reader": (InitReaderConfig, section("init_reader")),
    "init_retriever": (InitRetrieverConfig, section("init_retriever")),
    "reader_warmup": (ReaderTrainConfig, section("reader_warmup")),
    "reader_lists": (ReaderListsConfig, section("reader_lists")),
    "reader": (ReaderTrainConfig, section("reader")),
    "reader_later": (ReaderTrainConfig, section("reader", later=True)),
    "score_passages": (ScorePassagesConfig, section("score_passages")),
    "retriever": (RetrieverTrainConfig, section("retriever")),
    "retriever_later": (RetrieverTrainConfig, section("retriever", later=True)),
    "embed_passages": (EmbedPassagesConfig, section("embed_passages")),
    "build_index": (IndexConfig, section("build_index")),
    "retrieve": (RetrieveConfig, section("retrieve")),
    "eval_reader": (EvalReaderConfig, section("eval_reader")),
    "eval_retrieval": (EvalRetrievalConfig, section("eval_retrieval")),
    "download": (DownloadConfig, section("download")),
    "demo_data": (DemoDataConfig, section("demo_data")),
    "scale_data": (ScaleDataConfig, section("scale_data")),
    "demo_gold": (DemoDataConfig, {**section("demo_data"), "n_passages": 1}),
}
# Accelerated evaluations (EvalReaderConfig's keep_* knobs over eval_reader), by name.
ACCELERATIONS = config.get("eval_reader_accelerations") or {}
for name, knobs in ACCELERATIONS.items():
    STAGES[f"eval_reader_fast_{name}"] = (
        EvalReaderConfig,
        {**section("eval_reader"), **knobs},
    )
# Each signal's scoring and retriever knobs: the round's own, with the signal's over them.
WHERE = {
    f"eval_reader_fast_{name}": f"eval_reader_accelerations.{name}"
    for name in ACCELERATIONS
}
# a signal's stage -> (the signal, its section, the round's own stage it goes over)
SIGNAL_STAGES = {}
for name, knobs in SIGNALS.items():
    for stage, own in (
        ("score_passages", "score_passages"),
        ("retriever", OWN_RETRIEVER),
    ):
        cls, base = STAGES[own]
        STAGES[f"{stage}_signal_{name}"] = (cls, {**base, **(knobs.get(stage) or {})})
        WHERE[f"{stage}_signal_{name}"] = f"distillation_signals.{name}.{stage}"
        SIGNAL_STAGES[f"{stage}_signal_{name}"] = (name, stage, own)
for split, spec in (DATA.get("questions") or {}).items():
    STAGES[f"prepare_{split}"] = (PrepareQuestionsConfig, spec.get("prepare") or {})
# What retrieval writes is one workflow key: every later rule reads it the same way.
for stage in ("bm25", "retrieve"):
    if "list_format" in STAGES[stage][1]:
        fail(
            f"{stage}.list_format",
            "is set by the workflow",
            "set list_format at the top",
        )
    # fid_json is fid's default: the stage files of other runs stay as they were
    if COMPACT:
        STAGES[stage][1]["list_format"] = "compact"


def knob_key(stage, key):
    """The config key that sets knob `key` of a stage: a signal's own, else the round's
    section's it inherits; a later round's override, else the section's."""
    if stage in SIGNAL_STAGES:
        name, part, own = SIGNAL_STAGES[stage]
        if key in ((SIGNALS[name] or {}).get(part) or {}):
            return f"distillation_signals.{name}.{part}.{key}"
        return knob_key(own, key)
    if stage.endswith("_later"):
        part = stage.removesuffix("_later")
        if key in ((config.get("later_rounds") or {}).get(part) or {}):
            return f"later_rounds.{part}.{key}"
        return f"{part}.{key}"
    return f"{WHERE.get(stage, stage)}.{key}"


# A teacher's temperature belongs to the scale of its scores (config/README.md "The
# retriever's teacher"): each retriever stage trains with the number of the mode its scores
# were written with (reader_temperature may be given per mode), and a signal that scores in
# another mode than its round does not inherit a number chosen for the round's mode: pdist
# would silently train at attention mass's 0.1, and EMDR2 would be refused for it.
SCORING = {"retriever": "score_passages", "retriever_later": "score_passages"}
SCORING |= {f"retriever_signal_{n}": f"score_passages_signal_{n}" for n in SIGNALS}


def score_mode(stage):
    return STAGES[stage][1].get("mode", ScorePassagesConfig.mode)


for retriever, scoring in SCORING.items():
    cls, knobs = STAGES[retriever]
    if "reader_temperature" not in knobs:
        continue
    key, value = knob_key(retriever, "reader_temperature"), knobs["reader_temperature"]
    mode, round_mode = score_mode(scoring), score_mode("score_passages")
    if mode not in SCORE_MODES:  # refused, with its key, by the checks below
        continue
    if not isinstance(value, dict) and not key.startswith("distillation_signals."):
        if mode != round_mode:  # a signal's, inherited
            signal = SIGNAL_STAGES[retriever][0]
            fail(
                f"distillation_signals.{signal}.retriever.reader_temperature",
                f"the signal scores with mode '{mode}', and {key} = {value} is the "
                f"temperature of the round's mode '{round_mode}'",
                f"set it for the signal, or give {key} per mode "
                f"({{{round_mode}: {value}}}: the modes it does not name use 1.0)",
            )
    try:
        value = reader_temperature_for(value, mode)
    except ConfigError as error:
        fail(
            key,
            str(error),
            "e.g. {attention_mass: 0.1}: the modes it does not name use 1.0",
        )
    knobs = {k: v for k, v in knobs.items() if k != "reader_temperature"}
    if value is not None:  # else RetrieverTrainConfig's default
        knobs["reader_temperature"] = value
    STAGES[retriever] = (cls, knobs)


def inherited_hint(stage, error):
    """For a signal's stage: which knob named in `error` it inherits, and where to set its own."""
    if stage not in SIGNAL_STAGES:
        return None
    name, part, _ = SIGNAL_STAGES[stage]
    for key in STAGES[stage][1]:
        origin = knob_key(stage, key)
        named = re.search(rf"\b{key} = ", str(error))
        if named and not origin.startswith("distillation_signals."):
            return f"{key} comes from {origin}: set distillation_signals.{name}.{part}.{key}"
    return None


CHECKED = {}  # stage -> its knobs as its job reads them
for stage, (cls, knobs) in STAGES.items():
    where = WHERE.get(stage, stage)
    try:
        CHECKED[stage] = config_from_dict(
            knobs, cls, source=f"config section '{where}'"
        )
    except ConfigError as error:
        hint = inherited_hint(stage, error) or f"see {cls.__name__}"
        raise WorkflowError(f"{error}. Hint: {hint}.") from None
    if stage.startswith("eval_reader_fast_") and not CHECKED[stage].accelerated:
        fail(
            where, "sets neither keep_passages nor keep_tokens", "set one, or remove it"
        )
# a signal's retriever stage file per seed: its knobs with seed + s
for name in SIGNALS:
    cls, knobs = STAGES[f"retriever_signal_{name}"]
    checked = CHECKED[f"retriever_signal_{name}"]
    for s in SIGNAL_SEEDS:
        STAGES[f"retriever_signal_{name}_seed{s}"] = (
            cls,
            {**knobs, "seed": checked.seed + s},
        )
        CHECKED[f"retriever_signal_{name}_seed{s}"] = dataclasses.replace(
            checked, seed=checked.seed + s
        )

# Cross-key checks the schema cannot express; then every data file must exist or be made.
# EMDR2 reads reader_score as log p(answer | question, passage): only pdist writes that.
for retriever, scoring in SCORING.items():
    if CHECKED[retriever].objective == "emdr2" and CHECKED[scoring].mode != "pdist":
        fail(
            # (round 0's section fails first: later, the objective comes from later_rounds)
            WHERE.get(
                retriever,
                retriever.replace("retriever_later", "later_rounds.retriever"),
            )
            + ".objective",
            f"emdr2 reads the reader's answer log-likelihoods, which score_passages mode "
            f"'pdist' writes, not '{CHECKED[scoring].mode}'",
            f"set mode: pdist in {WHERE.get(scoring, scoring)}",
        )
_own = (
    CHECKED["score_passages"],
    CHECKED[OWN_RETRIEVER],
)
for name in SIGNALS:
    if _own == tuple(
        CHECKED[f"{s}_signal_{name}"] for s in ("score_passages", "retriever")
    ):
        fail(
            f"distillation_signals.{name}",
            f"its knobs are round {SIGNAL_ROUND}'s own: it would train iter{SIGNAL_ROUND} again",
            "set a score_passages mode or retriever knob of its own, or remove it",
        )
_signal_knobs = {}  # signal -> its (scoring, retriever) knobs
for name in SIGNALS:
    knobs = tuple(
        CHECKED[f"{s}_signal_{name}"] for s in ("score_passages", "retriever")
    )
    for other, known in _signal_knobs.items():
        if known == knobs:
            fail(
                f"distillation_signals.{name}",
                f"its knobs are those of distillation_signals.{other}: both would score, "
                "train, embed and index the same",
                "give it a knob of its own, or remove one",
            )
    _signal_knobs[name] = knobs
for source in set(SIGNAL_SOURCES) & set(PRETRAINED):
    fail(
        "pretrained", f"{source!r} is also a distillation signal's source", "rename one"
    )
if FIRST != "bm25" and FIRST not in PRETRAINED:
    fail("first_retrieval", f"{FIRST!r} is not bm25 nor under pretrained", "add it")
for name in set(COMPARE) - {"bm25"} - set(PRETRAINED):
    fail("compare", f"{name!r} is not under pretrained", "add it there, or drop it")
if CURRICULUM and not DEMO:
    fail("data.curriculum", "only the demo world has gold lists", "remove it")
_index, _search = CHECKED["build_index"], CHECKED["retrieve"]
if (
    (_index.rerank or _index.refine_residual)
    and _search.shortlist is None
    and _index.shortlist < _search.top_k
):
    fail(
        "build_index.shortlist",
        f"{_index.shortlist} candidates cannot give retrieve.top_k = {_search.top_k}",
        "raise it, or set retrieve.shortlist >= top_k",
    )
for name, spec in EXTRACTS.items():
    if spec["archive"] not in DOWNLOADS:
        fail(f"data.extract.{name}.archive", "is no download", "name one")
RENAMED_RULES = {
    "retrieve_passages": "retrieve",
    "pretrained_encoder": "copy_packaged_model",
}
for rule_name, spec in config["resources"].items():
    if rule_name in RENAMED_RULES:
        fail(
            f"resources.{rule_name}",
            "this rule was renamed",
            f"use {RENAMED_RULES[rule_name]}",
        )
    if "mpi" in spec and spec.get("tasks_per_node", 1) < 2:
        fail(
            f"resources.{rule_name}.tasks_per_node",
            "an `mpi` (srun) job needs at least 2 tasks per node (the SLURM plugin refuses 1)",
            "give it >= 2 GPUs per node, or drop mpi and nodes for one process per job",
        )
MADE = {f"resources/{DATASET}/downloads/{n}" for n in DOWNLOADS}
MADE |= {f"resources/{DATASET}/extracted/{n}" for n in EXTRACTS}
GIVEN = {"data.passages": DATA.get("passages")}
for split, spec in (DATA.get("questions") or {}).items():
    GIVEN |= {f"data.questions.{split}.{k}": spec.get(k) for k in ("input", "index")}
for key, path in GIVEN.items():
    if not DEMO and path and path not in MADE and not Path(path).is_file():
        fail(key, f"the data file {path} does not exist", "fix the path or download it")
# A finished download against its entry: a checksum pinned after the first download is checked
# here, through the record written with the file from its bytes, and reruns nothing. (Not a
# verification job between the download and its consumers: rerun on a new pin, it would make
# Snakemake 9.27 skip the needrun check of every job downstream of it in that invocation, even
# behind ancient() inputs, so missing or changed outputs there would go unbuilt.)
for name, spec in DOWNLOADS.items():
    try:
        check_existing_download(
            f"resources/{DATASET}/downloads/{name}",
            f"resources/{DATASET}/downloads/checksums/{name}.json",
            spec["url"],
            spec["checksum"],
            spec.get("bytes"),
        )
    except DownloadError as error:
        raise WorkflowError(f"config key 'data.downloads.{name}': {error}") from None


wildcard_constraints:
    run=re.escape(RUN),
    dataset=re.escape(DATASET),
    i=r"\d+",
    k=r"\d+",
    split="train|dev|test",
    stage="|".join(STAGES),
    source="|".join(map(re.escape, ["bm25", *DENSE])),


localrules:
    stage_config,
    copy_packaged_model,
    fetch_model,
    report_tables,
    report_flags,
    report_plots,
    report_config,
    report_acceleration,
    report_signals,
    report_training,
    report_memory,
    report_runtimes,


# Downloads, and the extraction of what they fetched, run where Snakemake runs: that machine
# reaches the internet, the compute nodes of most clusters do not. On a cluster whose nodes do,
# data.download_on_compute_nodes: true submits them like every other job.
if not DATA.get("download_on_compute_nodes", False):

    localrules:
        download,
        extract,


# ---------------------------------------------------------------- paths
def caption_text(name):
    """A report figure's caption (rules/report/<name>.rst): its page shows it above the figure,
    passed as a param so that an edited caption rewrites the page."""
    return Path(workflow.basedir, "rules", "report", f"{name}.rst").read_text()


def res_path(*parts):
    return Path("results", RUN, *map(str, parts)).as_posix()


def passages():
    if SCALE:
        return res_path("data/scale/psgs_w100.tsv")
    return res_path("data/demo/world/passages.tsv") if DEMO else DATA["passages"]


def questions(split):
    if SCALE:
        return res_path(f"data/scale/{split}.jsonl")
    return res_path(f"data/demo/world/{split}.jsonl" if DEMO else f"data/{split}.jsonl")


def list_store():
    """The passage store compact lists are read through (an input), or none."""
    return [res_path("passages/store")] if COMPACT else []


def passages_flag():
    """`--passages STORE` for the rules that read retrieved lists, when they are compact."""
    return ["--passages", *list_store()] if COMPACT else []


def stage_file(stage):
    return res_path(f"config/{stage}.yaml")


def round_source(i):
    """The retriever whose lists round i reads: the first retrieval, then the last round's
    (decided by fid.evaluation.run_system, for fid ask and the report's headline too)"""
    return lists_source(i, FIRST)


def retrieval(source, split):
    return res_path(f"{source}/retrieval/{split}.json")


def named(path_or_name):
    """(flag value, input paths): a folder as it is; a hub name as the folder that rule
    fetch_model fills (jobs read no hub)."""
    if path_or_name in HUB_MODELS.values():
        folder = f"resources/models/{folder_name(path_or_name)}"
        return folder, [folder]
    return path_or_name, [path_or_name]


def model_spec(kind):
    """The reader or retriever every chain starts from: built here (init), an entry of
    `pretrained` (its encoder), or a hub name or folder."""
    made = res_path(f"init/{kind}")
    if MODELS[kind] == "init":
        return made, [made]
    if MODELS[kind] in PRETRAINED:
        return encoder(MODELS[kind])
    return named(MODELS[kind])


def encoder(source):
    """(flag value, input paths) of the encoder of a dense source."""
    if source.startswith("iter"):
        return res_path(f"{source}/retriever/model"), [
            res_path(f"{source}/retriever/model")
        ]
    if "package" in PRETRAINED[source]:
        return f"resources/pretrained/{source}", [f"resources/pretrained/{source}"]
    return named(PRETRAINED[source]["model"])


def _hub_names():
    """The hub models the config names: models.reader/retriever and pretrained `model`
    entries that are neither init, a pretrained entry, nor a path that exists here."""
    names = [MODELS[kind] for kind in ("reader", "retriever")]
    names += [spec["model"] for spec in PRETRAINED.values() if "model" in spec]
    return [
        name
        for name in dict.fromkeys(names)
        if name != "init" and name not in PRETRAINED and not Path(name).exists()
    ]


# folder under resources/models -> hub name; each fetched once, on this machine (fetch_model)
HUB_MODELS = {folder_name(name): name for name in _hub_names()}
REVISIONS = MODELS.get("revisions") or {}
# Jobs read fetched folders only and ask no hub (compute nodes of most clusters have no
# internet; where they do, every rank would fill one cache at once): every job inherits
# HF_HUB_OFFLINE=1 (local jobs from this process, SLURM jobs through sbatch, whose job step
# reads this file again); rule fetch_model alone gets the setting Snakemake was started with.
HUB_OFFLINE_GIVEN = take_jobs_offline()


def check_hub_models(warn_only):
    """Every hub model not fetched yet can be fetched from here (the hub answers, or the local
    Hugging Face cache holds it), else the run stops before its first job (onstart, in the
    Snakefile), naming the model and the one command that fetches it elsewhere; a dry run
    warns when its plan is built (it fetches nothing)."""
    for folder, name in HUB_MODELS.items():
        if Path(f"resources/models/{folder}/{HUB_RECORD}").is_file():
            continue
        problem = fetchable(name, REVISIONS.get(name))
        if problem is None:
            continue
        if warn_only:
            logging.getLogger("fid").warning("%s (a run would stop here)", problem)
        else:
            raise WorkflowError(problem)


if workflow.output_settings.dryrun:
    check_hub_models(warn_only=True)


# ---------------------------------------------------------------- resources and launchers
def _configured(rule):
    return {**config["resources"]["default"], **config["resources"].get(rule, {})}


# Rules that run another rule's command on other inputs: they take its resources.
RESOURCES_OF = {
    "eval_reader_fast": "eval_reader",
    "score_passages_signal": "score_passages",
    "train_retriever_signal": "train_retriever",
}


def _resources(rule):
    """`resources.default` overridden by the rule's own entry (or that of the rule whose
    command it runs); a training rule's mem_mb is its plan's (rules/memory.smk) unless its
    own entry sets one."""
    runs = RESOURCES_OF.get(rule, rule)
    return {**_configured(runs), **planned_request(runs)}


def res(rule):
    """Resources of a rule: `resources.default` overridden by the rule's own entry, a training
    job's mem_mb from its plan (rules/memory.smk), and the sbatch options the workflow adds
    (rules/slurm.smk)."""
    r = _resources(rule)
    kept = {k: v for k, v in r.items() if k not in WORKFLOW_ONLY_KEYS}
    return {**kept, **planned_mem_mb(rule), "slurm_extra": slurm_extra(rule)}


def threads(rule):
    r = _resources(rule)
    return r["cpus_per_task"] if "mpi" in r else r.get("threads", 1)


def fid(rule):
    """The command line that starts `fid` for a rule: one srun task per GPU across nodes
    (SLURM, DESIGN.md section 5), local torchrun ranks, or one plain process. Each writes
    its whole log to the rule's `log:` and shows only progress, results and warnings on the
    console (`fid --log-file`); torchrun keeps no log folder of its own (`--log-dir`).
    """
    # the one job that may ask the hub, with the hub setting Snakemake was started with
    offline = f"HF_HUB_OFFLINE={HUB_OFFLINE_GIVEN} " if rule == "fetch_model" else ""
    return offline + _launcher(rule)


def _launcher(rule):
    r = _resources(rule)
    if "mpi" in r:
        # No --gpus-per-task: with it, SLURM gives each rank a device cgroup holding only its
        # own GPU (ConstrainDevices), and NCCL cannot reach the node's other GPUs over
        # NVLink/CUDA IPC. Every rank sees all of its node's GPUs and binds its own
        # (cuda:LOCAL_RANK, fid.runtime.distributed).
        return (
            "{resources.mpi} --nodes={resources.nodes}"
            " --ntasks-per-node={resources.tasks_per_node}"
            " --cpus-per-task={resources.cpus_per_task} --kill-on-bad-exit=1"
            f"{srun_exports(rule)} fid --threads {{resources.cpus_per_task}} --log-file {{log:q}}"
        )
    ranks = local_ranks(r.get("processes", 1))
    if ranks > 1:
        per_rank = max(1, r.get("threads", 1) // ranks)
        return (
            f"torchrun --standalone --nproc-per-node={ranks} --log-dir=/dev/null"
            f" -m fid --threads {per_rank} --log-file {{log:q}}"
        )
    return "fid --threads {threads} --log-file {log:q}"


def local_ranks(processes):
    """The local ranks of a `processes: N` job: N on CPUs; on a machine with GPUs at most one
    per GPU (a rank needs a GPU of its own: fid refuses two on one), so the demo's 2-rank jobs
    run as one process on a one-GPU machine (the same steps, half the effective batch).
    """
    gpus = visible_gpus()
    return min(processes, gpus) if gpus else processes


# ---------------------------------------------------------------- report captions
def knob(stage, key):
    """A stage's knob as its job reads it (the dataclass default when the config omits it)."""
    return getattr(CHECKED[stage], key)


def dev_lists(model):
    """What a trained model is validated on (its own dev lists): the report's captions."""
    round_folder, stage = Path(model).parts  # "iter0", "reader"
    i = int(round_folder[4:])
    if stage == "retriever":
        n = knob("retriever" if i == 0 else "retriever_later", "n_passages")
        return f"{n} candidates per question, scored by round {i}'s reader"
    if stage == "reader_warmup":
        return "the gold passage alone"
    if i == 0 and CURRICULUM.get("round0_lists") == "demo":
        return f"the gold passage among {knob('demo_data', 'n_passages')} of its entity"
    n = knob("reader" if i == 0 else "reader_later", "n_passages")
    if i == 0 and CURRICULUM.get("round0_lists") == "gold_forced":
        return f"{FIRST}'s top {n}, the gold passage forced in"
    source = round_source(i)
    return f"top {n} of {'BM25' if source == 'bm25' else source}"


# ---------------------------------------------------------------- inputs of training jobs
def init_corpus(wc):
    """Texts the tiny models' tokenizers learn from: passages and training questions."""
    if DEMO:
        return [passages(), res_path("data/demo/world/reader/train.json")]
    return [passages()] + ([retrieval("bm25", "train")] if FIRST == "bm25" else [])


def reader_lists(i, stage, split):
    """The FiD-format lists a reader of round i trains and is validated on."""
    if stage == "reader_warmup":
        return res_path(f"data/demo/gold/reader/{split}.json")
    if i == 0 and CURRICULUM.get("round0_lists") == "demo":
        return res_path(f"data/demo/world/reader/{split}.json")
    if i == 0 and CURRICULUM.get("round0_lists") == "gold_forced":
        return res_path(f"iter0/reader_lists/{split}.json")
    return retrieval(round_source(i), split)


def start(kind, i, stage=None):
    """(flag value, input paths) of the model a reader / retriever of round i starts from."""
    if stage == "reader_warmup":
        return model_spec("reader")
    if kind == "reader" and i == 0 and CURRICULUM.get("warmup"):
        previous = res_path("iter0/reader_warmup/model")
    elif i > 0 and MODELS.get("continue"):
        previous = res_path(f"iter{i - 1}/{kind}/model")
    else:
        return model_spec(kind)
    return previous, [previous]


def stage_section(i, stage):
    """The config section a training job of round i reads: the stage's own in round 0 (and the
    warm-up stage, round 0's only), with `later_rounds` merged over it after."""
    return stage if stage == "reader_warmup" or int(i) == 0 else f"{stage}_later"


def scoring_config(wc):
    """The stage file of a score-passages job: the signal's own (wildcard signal), else
    score_passages'."""
    signal = wc.get("signal")
    return stage_file(f"score_passages_signal_{signal}" if signal else "score_passages")


def teacher(scoring, retriever):
    """(score mode, objective, control) of a retriever: control "uniform" for the no-teacher
    control (score mode uniform), "in_batch" for the one with no candidates (uniform scores,
    train_n_passages 1: its list's top passage against the batch's), "" for a teacher.
    """
    mode, knobs = CHECKED[scoring].mode, CHECKED[retriever]
    control = ""
    if mode == "uniform":
        control = "in_batch" if knobs.train_n_passages == 1 else "uniform"
    return mode, knobs.objective, control


def training_section(wc):
    """The config section of a training job (wildcards i, stage or signal)."""
    if wc.get("signal"):
        return f"retriever_signal_{wc.signal}_seed{wc.seed}"
    return stage_section(wc.i, wc.get("stage", "retriever"))


def training_inputs(wc):
    """Lists (reader) or reader scores (retriever; a signal's own), stage config and start
    model of a job."""
    i, stage = int(wc.i), wc.get("stage", "retriever")
    kind = "retriever" if stage == "retriever" else "reader"
    if kind == "retriever":
        scores = (
            f"iter{i}-{wc.signal}/scores"
            if wc.get("signal")
            else f"iter{i}/reader/scores"
        )
        data = {s: res_path(f"{scores}/{s}.json") for s in ("train", "dev")}
    else:
        data = {s: reader_lists(i, stage, s) for s in ("train", "dev")}
    init = start(kind, i, stage)[1]
    return {
        **data,
        "config": stage_file(training_section(wc)),
        "init": init,
        "store": list_store(),
    }
