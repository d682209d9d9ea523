"""Retrieval: BM25, retriever distillation, sharded passage embedding, index, dense search.

A retrieval "source" is bm25, iter{i} (the retriever distilled in round i) or a pretrained
encoder's name; each has results/{run}/{source}/retrieval/{split}.json. Round 0 reads the lists
of `first_retrieval`, round i > 0 those of iter{i-1}.

REQUIRED INPUTS: passages and questions (data.smk), reader scores (reader.smk), stage configs.
OUTPUTS:
    results/{run}/init/retriever/                      rule init_retriever (models.retriever: init)
    results/{run}/bm25/index/                          rule build_bm25
    results/{run}/bm25/retrieval/{split}.json          rule retrieve_bm25
    with bm25.shards = S > 1 instead:
    results/{run}/bm25/stats/                          rule bm25_stats
    results/{run}/bm25/shards/{k}/index/               rule build_bm25_shard (k = 1..S)
    results/{run}/bm25/shards/{k}/{split}.npz          rule retrieve_bm25_shard
    results/{run}/bm25/retrieval/{split}.json          rule merge_bm25
    results/{run}/iter{i}/retriever/model/             rule train_retriever
    results/{run}/{source}/embeddings/shard{k}.npy ... rule embed_passages (scatter)
    results/{run}/{source}/index/                      rule build_index (gather)
    results/{run}/{source}/retrieval/{split}.json      rule retrieve
    state/{run}/iter{i}/retriever/<key>/               training state, found by fid (not an output)
"""


rule init_retriever:
    input:
        corpus=init_corpus,
        config=stage_file("init_retriever"),
    output:
        directory("results/{run}/init/retriever"),
    log:
        "logs/init_retriever/{run}.log",
    benchmark:
        "logs/benchmarks/init_retriever/{run}.tsv"
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("init_retriever")
    resources:
        **res("init_retriever"),
    shell:
        fid("init_retriever") + " init-retriever --config {input.config:q}"
        " --corpus {input.corpus:q} --output {output:q}"


BM25_SHARDS = knob("bm25", "shards")


if BM25_SHARDS == 1:

    rule build_bm25:
        input:
            passages=passages(),
            config=stage_file("bm25"),
        output:
            directory("results/{run}/bm25/index"),
        log:
            "logs/build_bm25/{run}.log",
        benchmark:
            "logs/benchmarks/build_bm25/{run}.tsv"
        priority: 50
        conda:
            "envs/fid.yaml"
        threads: threads("build_bm25")
        resources:
            **res("build_bm25"),
        shell:
            fid("build_bm25")
            + " build-bm25 --config {input.config:q} --passages {input.passages:q}"
            " --output {output:q}"

    rule retrieve_bm25:
        input:
            index="results/{run}/bm25/index",
            passages=list_store() or passages(),
            questions=lambda wc: questions(wc.split),
            config=stage_file("bm25"),
        output:
            "results/{run}/bm25/retrieval/{split}.json",
        log:
            "logs/retrieve_bm25/{run}/{split}.log",
        benchmark:
            "logs/benchmarks/retrieve_bm25/{run}/{split}.tsv"
        priority: 50
        conda:
            "envs/fid.yaml"
        threads: threads("retrieve_bm25")
        resources:
            **res("retrieve_bm25"),
        shell:
            fid("retrieve_bm25")
            + " retrieve-bm25 --config {input.config:q} --index {input.index:q}"
            " --passages {input.passages:q} --questions {input.questions:q}"
            " --output {output:q}"

else:
    # bm25.shards = S > 1: the corpus's statistics once, S shard indexes built with them, each
    # split searched in every shard and merged into the global top k (fid.retrieval.bm25_*):
    # the lists one index gives, no job holding more than a shard. SLURM runs the shards side
    # by side, each with its rule's resources.

    rule bm25_stats:
        input:
            passages=passages(),
            config=stage_file("bm25"),
        output:
            directory("results/{run}/bm25/stats"),
        log:
            "logs/bm25_stats/{run}.log",
        benchmark:
            "logs/benchmarks/bm25_stats/{run}.tsv"
        priority: 50
        conda:
            "envs/fid.yaml"
        threads: threads("bm25_stats")
        resources:
            **res("bm25_stats"),
        shell:
            fid("bm25_stats")
            + " bm25-stats --config {input.config:q} --passages {input.passages:q}"
            " --output {output:q}"

    rule build_bm25_shard:
        input:
            stats="results/{run}/bm25/stats",
            passages=passages(),
            config=stage_file("bm25"),
        output:
            directory("results/{run}/bm25/shards/{k}/index"),
        log:
            "logs/build_bm25_shard/{run}/{k}.log",
        benchmark:
            "logs/benchmarks/build_bm25_shard/{run}/{k}.tsv"
        wildcard_constraints:
            k=r"\d+",
        priority: 50
        conda:
            "envs/fid.yaml"
        threads: threads("build_bm25_shard")
        resources:
            **res("build_bm25_shard"),
        params:
            shard=lambda wc: f"{wc.k}/{BM25_SHARDS}",  # K/S, 1-based
        shell:
            fid("build_bm25_shard")
            + " build-bm25 --config {input.config:q} --passages {input.passages:q}"
            " --shard {params.shard:q} --stats {input.stats:q} --output {output:q}"

    rule retrieve_bm25_shard:
        input:
            index="results/{run}/bm25/shards/{k}/index",
            questions=lambda wc: questions(wc.split),
            config=stage_file("bm25"),
        output:
            "results/{run}/bm25/shards/{k}/{split}.npz",
        log:
            "logs/retrieve_bm25_shard/{run}/{k}/{split}.log",
        benchmark:
            "logs/benchmarks/retrieve_bm25_shard/{run}/{k}/{split}.tsv"
        wildcard_constraints:
            k=r"\d+",
        priority: 50
        conda:
            "envs/fid.yaml"
        threads: threads("retrieve_bm25_shard")
        resources:
            **res("retrieve_bm25_shard"),
        shell:
            fid("retrieve_bm25_shard")
            + " retrieve-bm25-shard --config {input.config:q} --index {input.index:q}"
            " --questions {input.questions:q} --output {output:q}"

    rule merge_bm25:
        input:
            stats="results/{run}/bm25/stats",
            lists=expand(
                "results/{{run}}/bm25/shards/{k}/{{split}}.npz",
                k=range(1, BM25_SHARDS + 1),
            ),
            passages=list_store() or passages(),
            questions=lambda wc: questions(wc.split),
            config=stage_file("bm25"),
        output:
            "results/{run}/bm25/retrieval/{split}.json",
        log:
            "logs/merge_bm25/{run}/{split}.log",
        benchmark:
            "logs/benchmarks/merge_bm25/{run}/{split}.tsv"
        priority: 50
        conda:
            "envs/fid.yaml"
        threads: threads("merge_bm25")
        resources:
            **res("merge_bm25"),
        shell:
            fid("merge_bm25")
            + " merge-bm25-lists --config {input.config:q} --stats {input.stats:q}"
            " --shard-lists {input.lists:q} --passages {input.passages:q}"
            " --questions {input.questions:q} --output {output:q}"


rule train_retriever:
    input:
        unpack(training_inputs),
    output:
        directory("results/{run}/iter{i}/retriever/model"),
    log:
        "logs/train_retriever/{run}/iter{i}.log",
    benchmark:
        "logs/benchmarks/train_retriever/{run}/iter{i}.tsv"
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("train_retriever")
    resources:
        **res("train_retriever"),
    params:
        init=lambda wc: start("retriever", int(wc.i))[0],
        # fid finds (or starts) the run's state under it: state/.../<key>/ (not an output)
        state_root="state/{run}/iter{i}/retriever",
        passages=passages_flag(),
    shell:
        fid("train_retriever") + " train-retriever --config {input.config:q}"
        " --train {input.train:q} --dev {input.dev:q} --init-model {params.init:q}"
        " --output {output:q} --state-root {params.state_root:q} {params.passages:q}"
        ""


rule embed_passages:
    input:
        encoder=lambda wc: encoder(wc.source)[1],
        passages=passages(),
        config=stage_file("embed_passages"),
    output:
        multiext(
            "results/{run}/{source}/embeddings/shard{k}", ".npy", ".ids.npy", ".json"
        ),
    log:
        "logs/embed_passages/{run}/{source}/shard{k}.log",
    benchmark:
        "logs/benchmarks/embed_passages/{run}/{source}/shard{k}.tsv"
    wildcard_constraints:
        source="|".join(map(re.escape, DENSE)),
    priority: 40
    conda:
        "envs/fid.yaml"
    threads: threads("embed_passages")
    resources:
        **res("embed_passages"),
    params:
        model=lambda wc: encoder(wc.source)[0],
        prefix=lambda wc, output: output[0][: -len(".npy")],
        shards=SHARDS,
    shell:
        fid("embed_passages") + " embed-passages --config {input.config:q}"
        " --model {params.model:q} --passages {input.passages:q} --shard {wildcards.k:q}"
        " --n-shards {params.shards:q} --output {params.prefix:q}"


rule build_index:
    input:
        shards=expand(
            "results/{{run}}/{{source}}/embeddings/shard{k}{ext}",
            k=range(SHARDS),
            ext=[".npy", ".ids.npy", ".json"],
        ),
        config=stage_file("build_index"),
    output:
        directory("results/{run}/{source}/index"),
    log:
        "logs/build_index/{run}/{source}.log",
    benchmark:
        "logs/benchmarks/build_index/{run}/{source}.tsv"
    wildcard_constraints:
        source="|".join(map(re.escape, DENSE)),
    priority: 40
    conda:
        "envs/fid.yaml"
    threads: threads("build_index")
    resources:
        **res("build_index"),
    params:
        prefixes=lambda wc: [
            res_path(f"{wc.source}/embeddings/shard{k}") for k in range(SHARDS)
        ],
    shell:
        fid("build_index") + " build-index --config {input.config:q}"
        " --shards {params.prefixes:q} --output {output:q}"


rule retrieve:
    input:
        encoder=lambda wc: encoder(wc.source)[1],
        index="results/{run}/{source}/index",
        passages=list_store() or passages(),
        questions=lambda wc: questions(wc.split),
        config=stage_file("retrieve"),
    output:
        "results/{run}/{source}/retrieval/{split}.json",
    log:
        "logs/retrieve/{run}/{source}/{split}.log",
    benchmark:
        "logs/benchmarks/retrieve/{run}/{source}/{split}.tsv"
    wildcard_constraints:
        source="|".join(map(re.escape, DENSE)),
    priority: 40
    conda:
        "envs/fid.yaml"
    threads: threads("retrieve")
    resources:
        **res("retrieve"),
    params:
        model=lambda wc: encoder(wc.source)[0],
    shell:
        fid("retrieve") + " retrieve --config {input.config:q}"
        " --model {params.model:q} --index {input.index:q} --passages {input.passages:q}"
        " --questions {input.questions:q} --output {output:q}"
