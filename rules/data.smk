"""Data: downloads, extraction, question splits, the demo world, pretrained encoders.

REQUIRED INPUTS: for data.source = files, the files named under data (passages, questions,
indexes), or data.downloads entries (real public URLs with checksums) that produce them;
for the demo nothing (the world is generated).
OUTPUTS:
    resources/{dataset}/downloads/{name} (+ checksums/{name}.json)  rule download
    resources/{dataset}/extracted/{name}                             rule extract
    results/{run}/config/{stage}.yaml                                rule stage_config
    results/{run}/data/{split}.jsonl                                 rule prepare_questions
    results/{run}/data/demo/{variant}/...   (passages, questions, reader lists) make_demo_data
    results/{run}/data/scale/...   (psgs_w100.tsv, {split}.jsonl, stats.json)  make_scale_data
    results/{run}/passages/store/   (random access by id, for compact lists) build_passage_store
    resources/pretrained/{name}/                                     rule copy_packaged_model
    resources/models/{name}/  (a hub model at one commit, fetched.json)  rule fetch_model
"""

DEMO_FILES = ["passages.tsv"] + [f"{s}.jsonl" for s in ("train", "dev", "test")]
DEMO_FILES += [f"reader/{s}.json" for s in ("train", "dev", "test")]


# A download is keyed by what it fetches: its only rerun trigger is the URL. How hard it tries
# (the `download` section), the pinned checksum and the published size are params computed
# from `output`, which Snakemake does not compare for reruns (rules.py, _is_deriving_function),
# so that a changed timeout, a second run on the same dataset or pinning the checksum after the
# first download never fetches it again nor makes what was built from it out of date; a pinned
# checksum is checked against the download's record when the DAG is built (rules/common.smk).
rule download:
    output:
        file="resources/{dataset}/downloads/{name}",
        record="resources/{dataset}/downloads/checksums/{name}.json",
    log:
        "logs/download/{dataset}/{name}.log",
    benchmark:
        "logs/benchmarks/download/{dataset}/{name}.tsv"
    wildcard_constraints:
        name="|".join(map(re.escape, DOWNLOADS)) or "^$",
    conda:
        "envs/fid.yaml"
    threads: threads("download")
    resources:
        **res("download"),
    params:
        url=lambda wc: DOWNLOADS[wc.name]["url"],
        # lists, so that `:q` quotes flag and value one by one (none when not given: an
        # empty string would vanish from the command line, not stay an empty argument)
        checksum=lambda wc, output: (
            ["--checksum", DOWNLOADS[wc.name]["checksum"]]
            if DOWNLOADS[wc.name]["checksum"]
            else []
        ),
        size=lambda wc, output: (
            ["--bytes", DOWNLOADS[wc.name]["bytes"]]
            if "bytes" in DOWNLOADS[wc.name]
            else []
        ),
        settings=lambda wc, output: json.dumps(STAGES["download"][1]),
    shell:
        fid("download")
        + " download --settings {params.settings:q} --url {params.url:q}"
        " {params.checksum:q} {params.size:q} --output {output.file:q}"
        " --record {output.record:q}"


rule extract:
    input:
        lambda wc: f"resources/{DATASET}/downloads/{EXTRACTS[wc.name]['archive']}",
    output:
        "resources/{dataset}/extracted/{name}",
    log:
        "logs/extract/{dataset}/{name}.log",
    benchmark:
        "logs/benchmarks/extract/{dataset}/{name}.tsv"
    wildcard_constraints:
        name="|".join(map(re.escape, EXTRACTS)) or "^$",
    conda:
        "envs/fid.yaml"
    threads: threads("extract")
    resources:
        **res("extract"),
    params:
        # a list, so that `:q` quotes the flag and the member one by one (none for a .gz)
        member=lambda wc: (
            ["--member", EXTRACTS[wc.name]["member"]]
            if "member" in EXTRACTS[wc.name]
            else []
        ),
    shell:
        fid("extract")
        + " extract --archive {input:q} {params.member:q} --output {output:q}"


rule prepare_questions:
    input:
        unpack(
            lambda wc: {
                k: DATA["questions"][wc.split][k]
                for k in ("input", "index")
                if k in DATA["questions"][wc.split]
            }
        ),
        config=lambda wc: stage_file(f"prepare_{wc.split}"),
    output:
        "results/{run}/data/{split}.jsonl",
    log:
        "logs/prepare_questions/{run}/{split}.log",
    benchmark:
        "logs/benchmarks/prepare_questions/{run}/{split}.tsv"
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("prepare_questions")
    resources:
        **res("prepare_questions"),
    params:
        # a list, so that `:q` quotes the flag and the path one by one (none without an index)
        index=lambda wc, input: (
            ["--index", input.index] if "index" in input.keys() else []
        ),
        # another size is refused (prepare.accept_other_size: a warning); a function of
        # `output`, so that writing the expected size into the config reruns nothing
        size=lambda wc, output: (
            ["--expected-size", DATA["questions"][wc.split]["expected_size"]]
            if "expected_size" in DATA["questions"][wc.split]
            else []
        ),
    shell:
        fid("prepare_questions")
        + " prepare-questions --config {input.config:q} --input {input.input:q}"
        " {params.index:q} --output {output:q} {params.size:q}"


rule make_demo_data:
    input:
        config=lambda wc: stage_file(
            "demo_data" if wc.variant == "world" else "demo_gold"
        ),
    output:
        expand("results/{{run}}/data/demo/{{variant}}/{file}", file=DEMO_FILES),
    log:
        "logs/make_demo_data/{run}/{variant}.log",
    benchmark:
        "logs/benchmarks/make_demo_data/{run}/{variant}.tsv"
    wildcard_constraints:
        variant="world|gold",
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("make_demo_data")
    resources:
        **res("make_demo_data"),
    params:
        folder=lambda wc: res_path(f"data/demo/{wc.variant}"),
    shell:
        fid("make_demo_data")
        + " make-demo-data --config {input.config:q} --output {params.folder:q}"


rule make_scale_data:
    input:
        config=stage_file("scale_data"),
    output:
        expand(
            "results/{{run}}/data/scale/{file}",
            file=[
                "psgs_w100.tsv",
                "train.jsonl",
                "dev.jsonl",
                "test.jsonl",
                "stats.json",
            ],
        ),
    log:
        "logs/make_scale_data/{run}.log",
    benchmark:
        "logs/benchmarks/make_scale_data/{run}.tsv"
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("make_scale_data")
    resources:
        **res("make_scale_data"),
    params:
        folder=lambda wc: res_path("data/scale"),
    shell:
        fid("make_scale_data")
        + " make-scale-data --config {input.config:q} --output {params.folder:q}"


rule build_passage_store:
    input:
        passages=passages(),
    output:
        directory("results/{run}/passages/store"),
    log:
        "logs/build_passage_store/{run}.log",
    benchmark:
        "logs/benchmarks/build_passage_store/{run}.tsv"
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("build_passage_store")
    resources:
        **res("build_passage_store"),
    shell:
        fid("build_passage_store")
        + " build-passage-store --passages {input.passages:q} --output {output:q}"


rule copy_packaged_model:
    output:
        directory("resources/pretrained/{name}"),
    log:
        "logs/copy_packaged_model/{name}.log",
    wildcard_constraints:
        name="|".join(n for n, spec in PRETRAINED.items() if "package" in spec) or "^$",
    conda:
        "envs/fid.yaml"
    threads: threads("copy_packaged_model")
    resources:
        **res("copy_packaged_model"),
    params:
        package=lambda wc: PRETRAINED[wc.name]["package"],
    shell:
        fid("copy_packaged_model")
        + " copy-packaged-model --package {params.package:q}"
        " --output {output:q}"


rule fetch_model:
    output:
        directory("resources/models/{hub_model}"),
    log:
        "logs/fetch_model/{hub_model}.log",
    wildcard_constraints:
        hub_model="|".join(map(re.escape, HUB_MODELS)) or "^$",
    conda:
        "envs/fid.yaml"
    threads: threads("fetch_model")
    resources:
        **res("fetch_model"),
    params:
        name=lambda wc: HUB_MODELS[wc.hub_model],
        # a list, so that `:q` quotes the flag and the value one by one (none: main)
        revision=lambda wc: (
            ["--revision", REVISIONS[HUB_MODELS[wc.hub_model]]]
            if HUB_MODELS[wc.hub_model] in REVISIONS
            else []
        ),
    shell:
        fid("fetch_model")
        + " fetch-model --name {params.name:q} {params.revision:q} --output {output:q}"


rule stage_config:
    output:
        "results/{run}/config/{stage}.yaml",
    log:
        "logs/stage_config/{run}/{stage}.log",
    conda:
        "envs/fid.yaml"
    params:
        section=lambda wc: STAGES[wc.stage][1],
    script:
        "../workflow_scripts/write_yaml.py"
