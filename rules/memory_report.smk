"""The report's memory table: per trained model, the peak per rank its stage's plan predicted
(rules/memory.smk) against the peak its training logged, the job's host memory request and its
peak resident memory (workflow_scripts/report_memory.py).

REQUIRED INPUTS: the exported models (metrics.jsonl, train_config.yaml); the training jobs'
benchmark files where they exist.
OUTPUTS:
    results/{run}/report/memory.{csv,html}   rule report_memory
"""

MEMORY_REPORT = res_path("report/memory.html")


rule report_memory:
    input:
        models=[res_path(f"{m}/model") for m in trained_models()],
    output:
        table="results/{run}/report/memory.csv",
        page=report(
            "results/{run}/report/memory.html",
            category="3. Training",
            caption="report/memory.rst",
            labels={"page": "Memory: plans and peaks"},
        ),
    log:
        "logs/report_memory/{run}.log",
    conda:
        "envs/fid.yaml"
    params:
        models=trained_models(),
    script:
        "../workflow_scripts/report_memory.py"
