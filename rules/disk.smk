"""Disk: what every stage of the run will hold on disk, printed when the workflow loads (dry
runs too) and checked against the free space of each file system it writes to before the first
job (onstart, in the Snakefile). The figures are fid/memory/disk_sizes.py's formulas of
the config (download sizes, questions, top-k, rounds, shards, keep_last_checkpoints, the index
factory) and of the model and corpus sizes; docs/disk.md says how they were checked.

- `disk_check: refuse` (the default) stops a run that does not fit, with the table;
  `disk_check: warn` only warns (space freed while the run goes, a quota the free space does
  not show).

REQUIRED INPUTS: the config; memory.smk (the models' sizes, from their memory plans).
OUTPUTS: none (no rules): DISK_ROWS, DISK_SYSTEMS and check_disk().
"""

import hashlib

from fid.data.questions import load_questions
from fid.errors import InputError
from fid.runtime.disk_plan import (
    DiskRow,
    file_systems,
    folder_bytes,
    format_plan,
    short,
)

from fid.memory import disk_sizes
from fid.retrieval.bm25 import text_statistics
from fid.retrieval.residual_layout import code_bytes

DISK_MISC_BYTES = 500_000  # configs, logs, evaluations, the report (0.34 MB: tiny demo)


@functools.cache
def _demo_world():
    """The demo's world (a pure function of demo_data, built in a moment): its passages and
    questions size the plan before make_demo_data runs."""
    from fid.demo.world import build_world

    return build_world(
        config_from_dict(STAGES["demo_data"][1], DemoDataConfig).world_config()
    )


@functools.cache
def _scale_sizes():
    return config_from_dict(STAGES["scale_data"][1], ScaleDataConfig).sizes()


def _question_counts():
    """Questions per split: the demo world's and the rehearsal's by their knobs; a file's
    expected_size, else its index file's or its lines' count, where they are there."""
    if SCALE:
        return {split: _scale_sizes()[split] for split in ("train", "dev", "test")}
    if DEMO:
        world = _demo_world()
        return {split: len(q) for split, q in world.splits.items()}
    counts = {}
    for split, spec in DATA["questions"].items():
        index, given = Path(spec.get("index") or "-"), Path(spec["input"])
        counts[split] = spec.get("expected_size") or 0
        try:  # a broken file is refused with its own error by the job that reads it
            if not counts[split] and index.is_file():
                counts[split] = len(json.loads(index.read_text()))
            elif not counts[split] and given.is_file():
                counts[split] = len(load_questions(given))
        except (OSError, ValueError, TypeError, InputError):
            counts[split] = 0
    return counts


def _extracted():
    """(bytes, basis) of data.extract: files already there as they are; those the plan cannot
    tell yet (tar members before their archive is there) are named, not counted."""
    total, notes = 0, []
    for name, spec in EXTRACTS.items():
        out = Path(f"resources/{DATASET}/extracted/{name}")
        if out.is_file():
            size, basis = out.stat().st_size, "there"
        else:
            archive = Path(f"resources/{DATASET}/downloads/{spec['archive']}")
            size, basis = disk_sizes.extracted_bytes(
                archive,
                DOWNLOADS.get(spec["archive"], {}).get("bytes"),
                spec.get("member"),
            )
        notes.append(
            f"{name}: {basis}" if size is not None else f"not counted: {name} ({basis})"
        )
        total += size or 0
    return total, "; ".join(notes)


def _corpus():
    if SCALE:
        counts = _scale_sizes()
        # the rehearsal's lines: 11.9 GB at scale 1 (566 B a passage, measured)
        return disk_sizes.Corpus(counts["passages"], 566, len(str(counts["passages"])))
    if DEMO:
        world = _demo_world()
        text = sum(len(p.id) + len(p.title) + len(p.text) + 3 for p in world.passages)
        return disk_sizes.Corpus(
            len(world.passages),
            text / len(world.passages),
            max(len(p.id) for p in world.passages),
        )
    extracted = next(
        (
            name
            for name in EXTRACTS
            if f"resources/{DATASET}/extracted/{name}" == DATA["passages"]
        ),
        None,
    )
    estimate = None
    if extracted:
        spec = EXTRACTS[extracted]
        estimate = disk_sizes.extracted_bytes(
            Path("-"),
            DOWNLOADS.get(spec["archive"], {}).get("bytes"),
            spec.get("member"),
        )[0]
    return disk_sizes.corpus(DATA["passages"], estimate)


def _text_stats():
    """How the corpus tokenizes for BM25: measured on its first 4 MiB where it is there (the
    demo's world, built here); the rehearsal's generator's; else real Wikipedia's."""
    if SCALE:
        return disk_sizes.SCALE_TEXT
    if DEMO:  # the world is built here in a moment
        world = _demo_world()
        return disk_sizes.TextStats(**text_statistics(world.passages, CHECKED["bm25"]))
    path = Path(passages())
    if path.is_file():
        try:  # a broken file is refused with its own error by the job that reads it
            return disk_sizes.TextStats(**text_statistics(path, CHECKED["bm25"]))
        except (OSError, ValueError, InputError):
            pass
    return disk_sizes.WIKIPEDIA


def _chain_job(kind, i):
    """The training job (memory.smk) of round i's reader or retriever, or None."""
    rule_name = {"reader": "train_reader", "retriever": "train_retriever"}[kind]
    return training_job(rule_name, stage_section(i, kind))


def _weights(job):
    """fp32 bytes of a training job's model; an init model's at the vocabulary its tokenizer
    will learn (a small corpus gives fewer pieces than vocab_size)."""
    if job is None:
        return None
    if "init" in job.model:
        kind = job.model["init"]
        knobs = {**job.model["knobs"], "vocab_size": _learned_vocab(kind)}
        job = dataclasses.replace(job, model={"init": kind, "knobs": knobs})
    return memory_plans.weights(job)


def _tokenizer(kind):
    if MODELS[kind] == "init":
        return disk_sizes.TOKENIZER_BYTES_PER_TOKEN * _learned_vocab(kind)
    return disk_sizes.HUB_TOKENIZER_BYTES


LEARNED_VOCAB_TEXT_LIMIT = 16 << 20  # larger corpora fill vocab_size


@functools.cache
def _learned_vocab(kind):
    """The vocabulary an init model's tokenizer will learn: trained here, as `fid init-*`
    trains it, on the texts it will learn from (the demo world's passages and training
    questions; else the passage file when it is there and small), once per corpus (kept
    with the memory plans); vocab_size where the corpus is large or not there yet."""
    size = CHECKED[f"init_{kind}"].vocab_size
    if DEMO:
        world = _demo_world()
        texts = [t for p in world.passages for t in (p.title, p.text)]
        texts += [t for q in world.splits["train"] for t in (q.question, *q.answers)]
    elif Path(passages()).is_file() and Path(passages()).stat().st_size <= (
        LEARNED_VOCAB_TEXT_LIMIT
    ):
        from fid.demo.corpus import corpus_texts

        texts = list(corpus_texts([passages()]))
    else:
        return size
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()

    def learn():
        from fid.demo import tiny_models

        train = {"reader": tiny_models.train_tokenizer,
                 "retriever": tiny_models.train_bert_tokenizer}[kind]  # fmt: skip
        return {"vocab": len(train(texts, size))}

    material = {"kind": "vocab", "init": kind, "vocab_size": size, "texts": digest}
    return memory_plans._stored(material, learn)["vocab"]


def _package_bytes(package):
    """(bytes, basis) of a packaged model's folder, as the package installed it."""
    from fid.models.packaged import packaged_model_path

    try:
        return folder_bytes(packaged_model_path(package)), f"{package}'s files"
    except InputError as error:
        return None, str(error)


def _dense_width(source):
    """The embedding width of a dense source: the retriever's projection, else its encoder's
    hidden size; None where the shape cannot be read here."""
    if source in PRETRAINED:
        spec = PRETRAINED[source]
        model = (
            {"package": spec["package"]}
            if "package" in spec
            else {"name": spec["model"]}
        )
        projection = None
    else:
        model = planned_shape("retriever")[0]
        projection = knob(stage_section(0, "retriever"), "projection_dim")
    if projection:
        return projection
    try:
        return memory_plans.width(model)
    except memory_plans.PlanUnavailable:
        return None


def _lists(stage, folder, splits, top_k, corpus, factor=1.0):
    questions = sum(QUESTIONS[s] for s in splits)
    planned = disk_sizes.list_bytes(questions, top_k, corpus, COMPACT) * factor
    what = "compact" if COMPACT else "FiD json"
    return DiskRow(
        stage,
        folder,
        int(planned),
        f"{questions:,} questions x {top_k} passages, {what}",
    )


def _dense_rows(source, corpus, splits):
    dim = _dense_width(source)
    rows = []
    if dim is None:
        return [
            DiskRow(
                f"{source} embeddings + index", res_path(source), None, "width unknown"
            )
        ]
    rows.append(
        DiskRow(
            f"{source} embeddings",
            res_path(f"{source}/embeddings"),
            disk_sizes.embeddings_bytes(corpus, dim),
            f"{corpus.passages:,} passages x {dim} dims, float16",
        )
    )
    index = CHECKED["build_index"]
    refine = code_bytes(index.refine_residual, dim) if index.refine_residual else 0
    planned, basis = disk_sizes.index_bytes(
        corpus, dim, index.factory, index.rerank, refine
    )
    rows.append(DiskRow(f"{source} index", res_path(f"{source}/index"), planned, basis))
    top_k = knob("retrieve", "top_k")
    rows.append(
        _lists(
            f"{source} lists",
            res_path(f"{source}/retrieval"),
            splits,
            top_k,
            corpus,
        )
    )
    return rows


def _trained_rows(name, state, export, job, tokenizer, stage):
    weights = _weights(job)
    kept = disk_sizes.kept_checkpoints(
        knob(stage, "max_steps"),
        knob(stage, "save_every_steps"),
        knob(stage, "keep_last_checkpoints"),
    )
    return [
        disk_sizes.row(
            f"state {name}", state, disk_sizes.state_bytes(weights, tokenizer, kept)
        ),
        disk_sizes.row(
            f"{name} model",
            export,
            disk_sizes.model_files_bytes(export, weights, tokenizer),
        ),
    ]


def disk_rows():
    """The plan's rows, in the order the run writes them."""
    corpus = _corpus()
    rows = []
    if DOWNLOADS:
        sizes = [spec.get("bytes") for spec in DOWNLOADS.values()]
        unknown = [n for n, spec in DOWNLOADS.items() if spec.get("bytes") is None]
        basis = "their bytes in the config" + (
            f"; not counted: {', '.join(unknown)} (no bytes)" if unknown else ""
        )
        rows.append(
            DiskRow(
                "downloads",
                f"resources/{DATASET}/downloads",
                sum(s or 0 for s in sizes),
                basis,
            )
        )
    if EXTRACTS:
        rows.append(
            disk_sizes.row("extracted", f"resources/{DATASET}/extracted", _extracted())
        )
    for folder, name in HUB_MODELS.items():
        job = next(
            (_chain_job(k, 0) for k in ("reader", "retriever") if MODELS[k] == name),
            None,
        )
        path = f"resources/models/{folder}"
        rows.append(
            disk_sizes.row(
                f"model {name}",
                path,
                disk_sizes.model_files_bytes(
                    path, _weights(job), disk_sizes.HUB_TOKENIZER_BYTES
                ),
            )
        )
    for name, spec in PRETRAINED.items():
        if "package" in spec:
            rows.append(
                disk_sizes.row(
                    f"pretrained {name}",
                    f"resources/pretrained/{name}",
                    _package_bytes(spec["package"]),
                )
            )
    questions = sum(QUESTIONS.values())
    data = questions * 150 + (corpus.text_bytes if SCALE else 0)
    if DEMO:  # the world and its gold copy, each with its corpus and reader files
        data = disk_sizes.demo_data_bytes(
            corpus, questions, CHECKED["demo_data"].n_passages
        )
    rows.append(
        DiskRow(
            "questions and data",
            res_path("data"),
            data,
            f"{questions:,} questions"
            + (", the generated corpus" if DEMO or SCALE else ""),
        )
    )
    if COMPACT:
        rows.append(
            DiskRow(
                "passage store",
                res_path("passages"),
                corpus.passages * disk_sizes.STORE_BYTES_PER_PASSAGE,
                f"{corpus.passages:,} passages x {disk_sizes.STORE_BYTES_PER_PASSAGE} B",
            )
        )
    if "bm25" in SOURCES and knob("bm25", "shards") == 1:
        rows.append(
            disk_sizes.row(
                "bm25 index",
                res_path("bm25/index"),
                disk_sizes.bm25_bytes(corpus, _text_stats()),
            )
        )
    elif "bm25" in SOURCES:
        # bm25.shards > 1: the statistics, and the shard indexes with their lists (npz)
        shards = knob("bm25", "shards")
        splits = {"train", "dev", *EVAL_SPLITS} if FIRST == "bm25" else EVAL_SPLITS
        questions = sum(QUESTIONS[s] for s in splits)
        top_k = knob("bm25", "top_k")
        indexes, basis = disk_sizes.bm25_shards_bytes(corpus, _text_stats(), shards)
        lists = shards * disk_sizes.list_bytes(questions, top_k, corpus, True)
        rows.append(
            disk_sizes.row(
                "bm25 statistics",
                res_path("bm25/stats"),
                disk_sizes.bm25_stats_bytes(corpus, _text_stats()),
            )
        )
        rows.append(
            DiskRow(
                f"bm25 shard indexes and lists ({shards})",
                res_path("bm25/shards"),
                indexes + lists,
                f"{basis}; {questions:,} questions x {top_k} passages each, npz",
            )
        )
        rows.append(
            _lists(
                "bm25 lists",
                res_path("bm25/retrieval"),
                {"train", "dev", *EVAL_SPLITS} if FIRST == "bm25" else EVAL_SPLITS,
                knob("bm25", "top_k"),
                corpus,
            )
        )
    for kind in ("reader", "retriever"):
        if MODELS[kind] == "init":
            weights = _weights(_chain_job(kind, 0))
            rows.append(
                disk_sizes.row(
                    f"init {kind}",
                    res_path(f"init/{kind}"),
                    disk_sizes.model_files_bytes(
                        res_path(f"init/{kind}"), weights, _tokenizer(kind)
                    ),
                )
            )
    for source in COMPARE:
        if source in PRETRAINED:
            rows += _dense_rows(source, corpus, EVAL_SPLITS)
    if CURRICULUM.get("warmup"):
        rows += _trained_rows(
            "iter0/reader_warmup",
            "state/{RUN}/iter0/reader_warmup".format(RUN=RUN),
            res_path("iter0/reader_warmup/model"),
            training_job("train_reader", "reader_warmup"),
            _tokenizer("reader"),
            "reader_warmup",
        )
    for i in range(K):
        source_k = knob("bm25" if round_source(i) == "bm25" else "retrieve", "top_k")
        rows += _trained_rows(
            f"iter{i}/reader",
            f"state/{RUN}/iter{i}/reader",
            res_path(f"iter{i}/reader/model"),
            _chain_job("reader", i),
            _tokenizer("reader"),
            stage_section(i, "reader"),
        )
        rows.append(
            _lists(
                f"iter{i} scores",
                res_path(f"iter{i}/reader/scores"),
                ("train", "dev"),
                source_k,
                corpus,
                disk_sizes.SCORES_OVER_LISTS["compact" if COMPACT else "fid_json"],
            )
        )
        rows += _trained_rows(
            f"iter{i}/retriever",
            f"state/{RUN}/iter{i}/retriever",
            res_path(f"iter{i}/retriever/model"),
            _chain_job("retriever", i),
            _tokenizer("retriever"),
            stage_section(i, "retriever"),
        )
        # the last round's lists are evaluated only; the others' train and dev lists are read
        # by the next round
        splits = EVAL_SPLITS if i == K - 1 else {"train", "dev", *EVAL_SPLITS}
        rows += _dense_rows(f"iter{i}", corpus, splits)
    for name in SIGNALS:  # its scores once, then each seed's retriever and lists
        rows.append(
            _lists(
                f"iter{SIGNAL_ROUND}-{name} scores",
                res_path(f"iter{SIGNAL_ROUND}-{name}/scores"),
                ("train", "dev"),
                knob("retrieve", "top_k") if K > 1 else source_k,
                corpus,
                disk_sizes.SCORES_OVER_LISTS["compact" if COMPACT else "fid_json"],
            )
        )
    for source, name in SIGNAL_SOURCES.items():
        rows += _trained_rows(
            f"{source}/retriever",
            f"state/{RUN}/{source}/retriever",
            res_path(f"{source}/retriever/model"),
            training_job("train_retriever", f"retriever_signal_{name}"),
            _tokenizer("retriever"),
            f"retriever_signal_{name}",
        )
        rows += _dense_rows(source, corpus, EVAL_SPLITS)
    rows.append(
        DiskRow(
            "configs, logs, evaluations, report",
            res_path("report"),
            DISK_MISC_BYTES,
            "a constant",
        )
    )
    return rows


QUESTIONS = _question_counts()
DISK_ROWS = disk_rows() if workflow.is_main_process else []


# what each file system still needs (each row's folder walked once) and has free, when loaded
DISK_SYSTEMS = file_systems(DISK_ROWS)


def check_disk(refuse):
    """The plan against each file system's free space (onstart, in the Snakefile): a run that
    does not fit stops with the table unless disk_check is warn."""
    if not short(DISK_SYSTEMS):
        return
    table = format_plan(DISK_ROWS, DISK_SYSTEMS)
    message = (
        f"the run does not fit on disk:\n{table}\nHint: free space or move results/ and "
        "state/ (a link to a larger file system), or set disk_check: warn to run anyway "
        "(docs/disk.md)"
    )
    if refuse:
        raise WorkflowError(message)
    logging.getLogger("fid").warning(message)


if DISK_ROWS:
    snakemake_logger.info(
        "disk plan (what each stage will hold once done):\n"
        + format_plan(DISK_ROWS, DISK_SYSTEMS)
    )
    if workflow.output_settings.dryrun and short(DISK_SYSTEMS):
        logging.getLogger("fid").warning(
            "the run does not fit on disk (above): a run would stop here unless "
            "disk_check: warn"
        )
