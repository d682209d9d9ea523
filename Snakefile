"""FiD with reader-to-retriever distillation (Izacard & Grave 2021), from data to report.

    snakemake --cores 2                          # the embedded demo (config/config.yaml)
    snakemake --configfile config/nq.yaml -n     # NQ at real scale (plan only)
    snakemake --report report.html               # after a run: figures, tables, config

Path convention (every rule calls one `fid` subcommand; see config/README.md):
    resources/{dataset}/downloads/{name}           downloads (checksummed), extracted/{name}
    resources/pretrained/{name}/                   pretrained encoders shipped by packages
    results/{run}/config/{stage}.yaml              each stage's knobs as its jobs read them
    results/{run}/data/...                         question splits, the demo world
    results/{run}/init/{reader,retriever}/         tiny models built on the spot
    results/{run}/{source}/retrieval/{split}.json  lists retrieved by source = bm25, iter{i}
                                                   (distilled in round i) or a pretrained name
    results/{run}/{source}/embeddings/shard{k}.*   passage embeddings (scatter), index/ (gather)
    results/{run}/iter{i}/reader/model/            round i's reader; scores/{split}.json, eval/
    results/{run}/iter{i}/retriever/model/         round i's retriever
    results/{run}/{source}/eval/{split}.json       top-k accuracy; baseline/{split}.json
    results/{run}/report/                          tables, plots and config of the report
    state/{run}/iter{i}/{stage}/<key>/             resumable training state (never an output)
    logs/{rule}/{run}/..., logs/benchmarks/{rule}/{run}/... (benchmarks/ holds code)
"""

import os

from snakemake.utils import min_version

import fid

min_version("9.0")
FID_MIN_VERSION = (0, 1, 0)
if tuple(int(p) for p in fid.__version__.split(".")[:3]) < FID_MIN_VERSION:
    raise ImportError(
        f"fid {fid.__version__} is too old: pip install -e . (needs 0.1.0)"
    )


# The demo config, unless --configfile names others: then they alone are the config
# (Snakemake would otherwise deep-merge them into the demo's).
if not workflow.overwrite_configfiles:

    configfile: os.path.join(workflow.basedir, "config", "config.yaml")


report: "rules/report/workflow.rst"


include: "rules/common.smk"
include: "rules/slurm.smk"
include: "rules/memory.smk"
include: "rules/disk.smk"
include: "rules/data.smk"
include: "rules/retrieval.smk"
include: "rules/reader.smk"
include: "rules/evaluation.smk"
include: "rules/signals.smk"
include: "rules/memory_report.smk"


# Before any job: every hub model can be fetched from here (rules/common.smk), and with the
# SLURM executor every job's layout fits its partition, and its status polls are reviewed.
onstart:
    check_hub_models(warn_only=False)
    check_disk(refuse=config.get("disk_check", "refuse") == "refuse")
    check_layouts_against_partitions(
        refuse=config.get("slurm_preflight", "refuse") == "refuse"
    )
    review_slurm_job_states()


rule all:
    default_target: True
    input:
        REPORT,
        MEMORY_REPORT,
        RUNTIMES,
