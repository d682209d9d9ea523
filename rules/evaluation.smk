"""Evaluation and report: reader exact match per round, retrieval top-k per source, a
most-common-answer baseline, tables, plots and the config used.

REQUIRED INPUTS: readers (reader.smk), retrieved lists (retrieval.smk), questions (data.smk).
OUTPUTS:
    results/{run}/iter{i}/reader/eval/{split}.json (+ .predictions.jsonl)   rule eval_reader
    results/{run}/{source}/eval/{split}.json                                rule eval_retrieval
    results/{run}/baseline/{split}.json                                     rule eval_baseline
    results/{run}/report/{exact_match,retrieval}.csv                        rule report_tables
    results/{run}/report/flags.csv   rounds worse than the one before them  rule report_flags
    results/{run}/report/{exact_match,retrieval_topk,training_curves}.png   rule report_plots
    results/{run}/report/config.yaml                                        rule report_config
    results/{run}/iter{i}/reader/eval_fast/{name}/{split}.json   rule eval_reader_fast (each
        entry of eval_reader_accelerations), results/{run}/report/acceleration.{csv,png}
        rule report_acceleration: speed against exact match, with the paired bootstrap interval
"""

READER_KEYS = [(i, s) for i in range(K) for s in EVAL_SPLITS]
RETRIEVAL_KEYS = [(src, s) for src in SOURCES for s in EVAL_SPLITS]
TRAINED = ["iter0/reader_warmup"] if CURRICULUM.get("warmup") else []
TRAINED += [f"iter{i}/{m}" for i in range(K) for m in ("reader", "retriever")]
REPORT = [
    res_path(f"report/{name}")
    for name in ("exact_match.csv", "retrieval.csv", "flags.csv", "config.yaml")
    + ("exact_match.png", "retrieval_topk.png", "training_curves.png")
    + (("acceleration.csv", "acceleration.png") if ACCELERATIONS else ())
]
FAST_KEYS = [(i, s, name) for i, s in READER_KEYS for name in ACCELERATIONS]


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
        " --metrics {output.metrics:q} {params.passages:q} > {log:q} 2>&1"


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
        " --metrics {output.metrics:q} {params.passages:q} > {log:q} 2>&1"


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
        table=report(
            "results/{run}/report/acceleration.csv",
            category="1. Reader",
            caption="report/acceleration.rst",
        ),
        plot=report(
            "results/{run}/report/acceleration.png",
            category="1. Reader",
            caption="report/acceleration.rst",
        ),
    log:
        "logs/report_acceleration/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        plain=READER_KEYS,
        fast=FAST_KEYS,
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
        " --output {output:q} > {log:q} 2>&1"


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
        " --output {output:q} > {log:q} 2>&1"


rule report_tables:
    input:
        reader=[res_path(f"iter{i}/reader/eval/{s}.json") for i, s in READER_KEYS],
        baseline=[res_path(f"baseline/{s}.json") for s in EVAL_SPLITS],
        retrieval=[res_path(f"{src}/eval/{s}.json") for src, s in RETRIEVAL_KEYS],
    output:
        exact_match=report(
            "results/{run}/report/exact_match.csv",
            category="1. Reader",
            caption="report/exact_match.rst",
        ),
        retrieval=report(
            "results/{run}/report/retrieval.csv",
            category="2. Retrieval",
            caption="report/retrieval.rst",
        ),
    log:
        "logs/report_tables/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        reader=READER_KEYS,
        baseline=EVAL_SPLITS,
        retrieval=RETRIEVAL_KEYS,
    script:
        "../workflow_scripts/report_tables.py"


rule report_flags:
    input:
        exact_match="results/{run}/report/exact_match.csv",
        retrieval="results/{run}/report/retrieval.csv",
    output:
        report(
            "results/{run}/report/flags.csv",
            category="0. Warnings",
            caption="report/flags.rst",
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
        models=[res_path(f"{m}/model") for m in TRAINED],
    output:
        exact_match=report(
            "results/{run}/report/exact_match.png",
            category="1. Reader",
            caption="report/exact_match.rst",
        ),
        topk=report(
            "results/{run}/report/retrieval_topk.png",
            category="2. Retrieval",
            caption="report/retrieval.rst",
        ),
        curves=report(
            "results/{run}/report/training_curves.png",
            category="3. Training",
            caption="report/training_curves.rst",
        ),
    log:
        "logs/report_plots/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        models=TRAINED,
    script:
        "../workflow_scripts/report_plots.py"


rule report_config:
    output:
        report(
            "results/{run}/report/config.yaml",
            category="4. Configuration",
            caption="report/config.rst",
        ),
    log:
        "logs/report_config/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        section=config,
    script:
        "../workflow_scripts/write_yaml.py"
