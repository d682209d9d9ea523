"""Evaluation and report: reader exact match per round, retrieval top-k per source, a
most-common-answer baseline, tables, plots, training curves, run times and the config used.

REQUIRED INPUTS: readers (reader.smk), retrieved lists (retrieval.smk), questions (data.smk),
the jobs' benchmark files (logs/benchmarks/{rule}/{run}/...).
OUTPUTS:
    results/{run}/iter{i}/reader/eval/{split}.json (+ .predictions.jsonl)   rule eval_reader
    results/{run}/{source}/eval/{split}.json                                rule eval_retrieval
    results/{run}/baseline/{split}.json                                     rule eval_baseline
    results/{run}/report/{exact_match,retrieval}.{csv,html}                 rule report_tables
    results/{run}/report/system.json  the run's system and its exact match  rule report_tables
    results/{run}/report/flags.{csv,html}  rounds worse than the one before rule report_flags
    results/{run}/report/exact_match.png, exact_match_plot.html,             rule report_plots
        retrieval_topk.{png,html}
    results/{run}/report/training_curves.{png,html}, training.{csv,html}    rule report_training
    results/{run}/report/runtimes.{csv,html}  time and memory per rule      rule report_runtimes
    results/{run}/report/config.{yaml,html}                                 rule report_config
    results/{run}/iter{i}/reader/eval_fast/{name}/{split}.json   rule eval_reader_fast (each
        entry of eval_reader_accelerations), results/{run}/report/acceleration.{csv,html,png},
        acceleration_plot.html  rule report_acceleration: speed against exact match, with the
        paired bootstrap interval
The report shows every table inline (an HTML page per table; its CSV is a download there) and
every figure as a page under its explanation (the PNG beside it), which the report would
otherwise show only behind an icon.
"""

READER_KEYS = [(i, s) for i in range(K) for s in EVAL_SPLITS]
RETRIEVAL_KEYS = [(src, s) for src in SOURCES for s in EVAL_SPLITS]
TRAINED = ["iter0/reader_warmup"] if CURRICULUM.get("warmup") else []
TRAINED += [f"iter{i}/{m}" for i in range(K) for m in ("reader", "retriever")]
REPORT = [
    res_path(f"report/{name}")
    for name in ("exact_match.html", "retrieval.html", "flags.html", "config.html")
    + (
        "exact_match_plot.html",
        "retrieval_topk.html",
        "training_curves.html",
        "training.html",
    )
    + (("acceleration.html", "acceleration_plot.html") if ACCELERATIONS else ())
    + (("signals.html", "signals_plot.html") if SIGNALS else ())
]
# Written last: the run time of every job that built the rest of the report.
RUNTIMES = res_path("report/runtimes.html")
FAST_KEYS = [(i, s, name) for i, s in READER_KEYS for name in ACCELERATIONS]


EVAL_N_PASSAGES = knob("eval_reader", "n_passages")


rule eval_reader:
    input:
        model="results/{run}/iter{i}/reader/model",
        questions=lambda wc: retrieval(round_source(wc.i), wc.split),
        config=stage_file("eval_reader"),
        store=list_store(),
    output:
        metrics="results/{run}/iter{i}/reader/eval/{split}.json",
        predictions="results/{run}/iter{i}/reader/eval/{split}.predictions.jsonl",
    log:
        "logs/eval_reader/{run}/iter{i}/{split}.log",
    benchmark:
        "logs/benchmarks/eval_reader/{run}/iter{i}/{split}.tsv"
    conda:
        "envs/fid.yaml"
    threads: threads("eval_reader")
    resources:
        **res("eval_reader"),
    params:
        passages=passages_flag(),
    shell:
        fid("eval_reader")
        + " eval-reader --config {input.config:q} --model {input.model:q}"
        " --questions {input.questions:q} --predictions {output.predictions:q}"
        " --metrics {output.metrics:q} {params.passages:q}"


rule eval_reader_fast:
    input:
        model="results/{run}/iter{i}/reader/model",
        questions=lambda wc: retrieval(round_source(wc.i), wc.split),
        config=lambda wc: stage_file(f"eval_reader_fast_{wc.name}"),
        store=list_store(),
    output:
        metrics="results/{run}/iter{i}/reader/eval_fast/{name}/{split}.json",
        predictions="results/{run}/iter{i}/reader/eval_fast/{name}/{split}.predictions.jsonl",
    log:
        "logs/eval_reader_fast/{run}/iter{i}/{name}/{split}.log",
    benchmark:
        "logs/benchmarks/eval_reader_fast/{run}/iter{i}/{name}/{split}.tsv"
    wildcard_constraints:
        name="|".join(ACCELERATIONS) or "^$",
    conda:
        "envs/fid.yaml"
    threads: threads("eval_reader")
    resources:
        **res("eval_reader"),
    params:
        passages=passages_flag(),
    shell:
        fid("eval_reader")
        + " eval-reader --config {input.config:q} --model {input.model:q}"
        " --questions {input.questions:q} --predictions {output.predictions:q}"
        " --metrics {output.metrics:q} {params.passages:q}"


rule report_acceleration:
    input:
        plain=[
            res_path(f"iter{i}/reader/eval/{s}.predictions.jsonl")
            for i, s in READER_KEYS
        ],
        plain_metrics=[
            res_path(f"iter{i}/reader/eval/{s}.json") for i, s in READER_KEYS
        ],
        fast=[
            res_path(f"iter{i}/reader/eval_fast/{n}/{s}.predictions.jsonl")
            for i, s, n in FAST_KEYS
        ],
        fast_metrics=[
            res_path(f"iter{i}/reader/eval_fast/{n}/{s}.json") for i, s, n in FAST_KEYS
        ],
    output:
        table="results/{run}/report/acceleration.csv",
        page=report(
            "results/{run}/report/acceleration.html",
            category="1. Reader",
            caption="report/acceleration.rst",
            labels={"page": "Faster answers (table)"},
        ),
        plot="results/{run}/report/acceleration.png",
        plot_page=report(
            "results/{run}/report/acceleration_plot.html",
            category="1. Reader",
            caption="report/acceleration.rst",
            labels={"page": "Faster answers (plot)"},
        ),
    log:
        "logs/report_acceleration/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        plain=READER_KEYS,
        fast=FAST_KEYS,
        caption=caption_text("acceleration"),
    script:
        "../workflow_scripts/report_acceleration.py"


rule eval_retrieval:
    input:
        questions="results/{run}/{source}/retrieval/{split}.json",
        config=stage_file("eval_retrieval"),
    output:
        "results/{run}/{source}/eval/{split}.json",
    log:
        "logs/eval_retrieval/{run}/{source}/{split}.log",
    benchmark:
        "logs/benchmarks/eval_retrieval/{run}/{source}/{split}.tsv"
    conda:
        "envs/fid.yaml"
    threads: threads("eval_retrieval")
    resources:
        **res("eval_retrieval"),
    shell:
        fid("eval_retrieval")
        + " eval-retrieval --config {input.config:q} --questions {input.questions:q}"
        " --output {output:q}"


rule eval_baseline:
    input:
        train=questions("train"),
        questions=lambda wc: questions(wc.split),
    output:
        "results/{run}/baseline/{split}.json",
    log:
        "logs/eval_baseline/{run}/{split}.log",
    benchmark:
        "logs/benchmarks/eval_baseline/{run}/{split}.tsv"
    conda:
        "envs/fid.yaml"
    threads: threads("eval_baseline")
    resources:
        **res("eval_baseline"),
    shell:
        fid("eval_baseline")
        + " eval-baseline --train {input.train:q} --questions {input.questions:q}"
        " --output {output:q}"


rule report_tables:
    input:
        reader=[res_path(f"iter{i}/reader/eval/{s}.json") for i, s in READER_KEYS],
        baseline=[res_path(f"baseline/{s}.json") for s in EVAL_SPLITS],
        retrieval=[res_path(f"{src}/eval/{s}.json") for src, s in RETRIEVAL_KEYS],
    output:
        exact_match="results/{run}/report/exact_match.csv",
        retrieval="results/{run}/report/retrieval.csv",
        # the system fid ask answers with (fid.evaluation.run_system) and its exact match
        system="results/{run}/report/system.json",
        exact_match_page=report(
            "results/{run}/report/exact_match.html",
            category="1. Reader",
            caption="report/exact_match.rst",
            labels={"page": "Exact match (table)"},
        ),
        retrieval_page=report(
            "results/{run}/report/retrieval.html",
            category="2. Retrieval",
            caption="report/retrieval.rst",
            labels={"page": "Retrieval top-k (table)"},
        ),
    log:
        "logs/report_tables/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        reader=READER_KEYS,
        baseline=EVAL_SPLITS,
        retrieval=RETRIEVAL_KEYS,
        n_passages=EVAL_N_PASSAGES,
        lists={i: round_source(i) for i in range(K)},
        first=FIRST,
    script:
        "../workflow_scripts/report_tables.py"


rule report_flags:
    input:
        exact_match="results/{run}/report/exact_match.csv",
        retrieval="results/{run}/report/retrieval.csv",
    output:
        table="results/{run}/report/flags.csv",
        page=report(
            "results/{run}/report/flags.html",
            category="0. Warnings",
            caption="report/flags.rst",
            labels={"page": "Warnings"},
        ),
    log:
        "logs/report_flags/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        rounds=K,
        first=FIRST,
    script:
        "../workflow_scripts/report_flags.py"


rule report_plots:
    input:
        exact_match="results/{run}/report/exact_match.csv",
        retrieval="results/{run}/report/retrieval.csv",
    output:
        exact_match="results/{run}/report/exact_match.png",
        topk="results/{run}/report/retrieval_topk.png",
        exact_match_page=report(
            "results/{run}/report/exact_match_plot.html",
            category="1. Reader",
            caption="report/exact_match_plot.rst",
            labels={"page": "Exact match (plot)"},
        ),
        topk_page=report(
            "results/{run}/report/retrieval_topk.html",
            category="2. Retrieval",
            caption="report/retrieval_topk.rst",
            labels={"page": "Retrieval top-k (plot)"},
        ),
    log:
        "logs/report_plots/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        captions={
            "exact_match": caption_text("exact_match_plot"),
            "topk": caption_text("retrieval_topk"),
        },
    script:
        "../workflow_scripts/report_plots.py"


rule report_training:
    input:
        models=[res_path(f"{m}/model") for m in TRAINED],
    output:
        table="results/{run}/report/training.csv",
        curves="results/{run}/report/training_curves.png",
        curves_page=report(
            "results/{run}/report/training_curves.html",
            category="3. Training",
            caption="report/training_curves.rst",
            labels={"page": "Training curves"},
        ),
        page=report(
            "results/{run}/report/training.html",
            category="3. Training",
            caption="report/training_curves.rst",
            labels={"page": "Training (table)"},
        ),
    log:
        "logs/report_training/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        models=TRAINED,
        dev_lists={m: dev_lists(m) for m in TRAINED},
        caption=caption_text("training_curves"),
    script:
        "../workflow_scripts/report_training.py"


rule report_runtimes:
    input:
        # every other result of the run first: this table times the jobs that built them
        REPORT,
    output:
        table="results/{run}/report/runtimes.csv",
        page=report(
            "results/{run}/report/runtimes.html",
            category="4. Run time",
            caption="report/runtimes.rst",
            labels={"page": "Run time per rule"},
        ),
    log:
        "logs/report_runtimes/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        folder="logs/benchmarks",
        run=RUN,
        dataset=DATASET,
    script:
        "../workflow_scripts/report_runtimes.py"


rule report_config:
    input:
        # the hub models as fetched (each folder's fetched.json: name, commit, source)
        fetched=expand("resources/models/{hub_model}", hub_model=HUB_MODELS),
    output:
        config="results/{run}/report/config.yaml",
        page=report(
            "results/{run}/report/config.html",
            category="5. Configuration",
            caption="report/config.rst",
            labels={"page": "Configuration"},
        ),
    log:
        "logs/report_config/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        # every key but gpu_memory (rules/memory.smk): what the run's GPUs hold, a check before
        # any job, not what the run computes; the SLURM profile sets it, so a run under the
        # profile and a dry run without it would otherwise disagree on this rule's params
        section={k: v for k, v in config.items() if k != "gpu_memory"},
    script:
        "../workflow_scripts/report_config.py"
