"""Reader: the tiny T5 built on the spot, FiD training per round, cross-attention scoring.

Round i trains `reader` (round 0) or `reader` + `later_rounds.reader` (i > 0) on the lists of
round_source(i); with models.continue, round i > 0 starts from round i-1's reader. The demo's
round 0 follows a curriculum (data.curriculum): `reader_warmup` on the gold passage alone,
then `reader` on the demo's gold + same-entity lists.

REQUIRED INPUTS: retrieved lists (retrieval.smk) or the demo's lists (data.smk), stage configs.
OUTPUTS:
    results/{run}/init/reader/                     rule init_reader (models.reader: init)
    results/{run}/iter0/reader_lists/{split}.json  rule make_reader_lists (demo curriculum)
    results/{run}/iter{i}/{stage}/model/           rule train_reader (stage: reader, reader_warmup)
    results/{run}/iter{i}/reader/scores/{split}.json   rule score_passages (train, dev)
    state/{run}/iter{i}/{stage}/<key>/             training state, found by fid (not an output)
"""


rule init_reader:
    input:
        corpus=init_corpus,
        config=stage_file("init_reader"),
    output:
        directory("results/{run}/init/reader"),
    log:
        "logs/init_reader/{run}.log",
    benchmark:
        "logs/benchmarks/init_reader/{run}.tsv"
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("init_reader")
    resources:
        **res("init_reader"),
    shell:
        fid("init_reader") + " init-reader --config {input.config:q}"
        " --corpus {input.corpus:q} --output {output:q}"


rule train_reader:
    input:
        unpack(training_inputs),
    output:
        directory("results/{run}/iter{i}/{stage}/model"),
    log:
        "logs/train_reader/{run}/iter{i}/{stage}.log",
    benchmark:
        "logs/benchmarks/train_reader/{run}/iter{i}/{stage}.tsv"
    wildcard_constraints:
        stage="reader|reader_warmup",
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("train_reader")
    resources:
        **res("train_reader"),
    params:
        init=lambda wc: start("reader", int(wc.i), wc.stage)[0],
        # fid finds (or starts) the run's state under it: state/.../<key>/ (not an output)
        state_root="state/{run}/iter{i}/{stage}",
        passages=passages_flag(),
    shell:
        fid("train_reader") + " train-reader --config {input.config:q}"
        " --train {input.train:q} --dev {input.dev:q} --init-model {params.init:q}"
        " --output {output:q} --state-root {params.state_root:q} {params.passages:q}"
        ""


rule score_passages:
    input:
        model="results/{run}/iter{i}/reader/model",
        questions=lambda wc: retrieval(round_source(wc.i), wc.split),
        config=scoring_config,
        store=list_store(),
    output:
        "results/{run}/iter{i}/reader/scores/{split}.json",
    log:
        "logs/score_passages/{run}/iter{i}/{split}.log",
    benchmark:
        "logs/benchmarks/score_passages/{run}/iter{i}/{split}.tsv"
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("score_passages")
    resources:
        **res("score_passages"),
    params:
        passages=passages_flag(),
    shell:
        fid("score_passages") + " score-passages --config {input.config:q}"
        " --model {input.model:q} --questions {input.questions:q}"
        " --output {output:q} {params.passages:q}"


rule make_reader_lists:
    input:
        retrieved=lambda wc: retrieval(FIRST, wc.split),
        questions=lambda wc: questions(wc.split),
        passages=passages(),
        config=stage_file("reader_lists"),
    output:
        "results/{run}/iter0/reader_lists/{split}.json",
    log:
        "logs/make_reader_lists/{run}/{split}.log",
    benchmark:
        "logs/benchmarks/make_reader_lists/{run}/{split}.tsv"
    priority: 50
    conda:
        "envs/fid.yaml"
    threads: threads("make_reader_lists")
    resources:
        **res("make_reader_lists"),
    shell:
        fid("make_reader_lists")
        + " make-reader-lists --config {input.config:q} --retrieved {input.retrieved:q}"
        " --questions {input.questions:q} --passages {input.passages:q}"
        " --output {output:q}"
