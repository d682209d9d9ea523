"""The `fid` command: one subcommand per workflow step.

Paths come from flags; knobs come from the YAML given by `--config` (defaults in fid/config.py).
This is the only place that parses arguments, sets up logging and turns errors into exit codes:
a bad input ends with one clear message and exit status 1, and no partial output.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from pathlib import Path

# stdlib only: the signal record is installed before torch is imported
from fid.signals import STOP_SIGNALS

logger = logging.getLogger("fid")

EXIT_ERROR = 1
# EX_TEMPFAIL: the job stopped cleanly on a signal and resumes when run again.
EXIT_PREEMPTED = 75


def _set_threads(threads: int | None) -> None:
    """Ties torch's CPU threads to what the job was given (2 busy processes on 2 cores with 2
    threads each run many times slower)."""
    if threads is None:
        threads = int(os.environ.get("FID_THREADS", "0")) or None
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _load_config(args: argparse.Namespace, config_class):
    """The command's knobs: `--config` loaded into `config_class` (None: the defaults)."""
    from fid.config import ConfigError, load_config

    try:
        return load_config(args.config, config_class)
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{args.config}: not UTF-8 text ({error.reason} at byte {error.start}): expected a "
            "YAML file of knobs"
        ) from None


def _check_precision(args: argparse.Namespace, cfg) -> None:
    """fp16 autocast exists on CUDA only: say so before any model is loaded."""
    from fid.config import ConfigError

    if cfg.precision == "fp16" and args.device.type != "cuda":
        raise ConfigError(
            f"{args.config}: precision = 'fp16' needs a CUDA device, but this job runs on "
            f"{args.device.type}: expected bf16 or fp32 (or auto) there"
        )


def _init_model(args, config_class, train_tokenizer, build, what: str) -> None:
    """A tokenizer trained on the corpus and a random model of the configured size."""
    from fid.corpus import corpus_texts
    from fid.fileio import atomic_directory

    cfg = _load_config(args, config_class)
    texts = list(corpus_texts(args.corpus))
    tokenizer = train_tokenizer(texts, cfg.vocab_size)
    model = build(cfg, vocab_size=len(tokenizer))
    with atomic_directory(args.output) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "wrote a random %s (%.2fM parameters) and a %d-piece tokenizer trained on %d texts to %s",
        what, n_params / 1e6, len(tokenizer), len(texts), args.output,
    )  # fmt: skip


def cmd_init_reader(args) -> None:
    from fid.config import InitReaderConfig
    from fid.init_models import init_reader, train_tokenizer

    _init_model(args, InitReaderConfig, train_tokenizer, init_reader, "T5")


def cmd_train_reader(args) -> None:
    from fid.config import ReaderTrainConfig
    from fid.model_folder import check_reader
    from fid.training.reader import train_reader

    cfg = _load_config(args, ReaderTrainConfig)
    _check_precision(args, cfg)
    check_reader(args.init_model)
    result = train_reader(
        cfg, args.train, args.dev, args.init_model, args.output, args.state_dir, args.device
    )
    logger.info("done: %s", result)


def cmd_eval_reader(args) -> None:
    from fid.config import EvalReaderConfig
    from fid.inference import evaluate_reader
    from fid.model_folder import check_reader

    cfg = _load_config(args, EvalReaderConfig)
    _check_precision(args, cfg)
    check_reader(args.model)
    evaluate_reader(cfg, args.model, args.questions, args.predictions, args.metrics, args.device)


def cmd_score_passages(args) -> None:
    from fid.config import ScorePassagesConfig
    from fid.inference import score_question_file
    from fid.model_folder import check_reader

    cfg = _load_config(args, ScorePassagesConfig)
    _check_precision(args, cfg)
    check_reader(args.model)
    score_question_file(cfg, args.model, args.questions, args.output, args.device)


def cmd_convert_checkpoint(args) -> None:
    from fid.convert import convert_reader_checkpoint
    from fid.model_folder import check_tokenizer_source

    if args.tokenizer is not None:
        check_tokenizer_source(args.tokenizer)
    convert_reader_checkpoint(args.checkpoint, args.output, tokenizer=args.tokenizer)


def cmd_init_retriever(args) -> None:
    from fid.config import InitRetrieverConfig
    from fid.init_models import init_retriever, train_bert_tokenizer

    _init_model(args, InitRetrieverConfig, train_bert_tokenizer, init_retriever, "BERT encoder")


def cmd_train_retriever(args) -> None:
    from fid.config import RetrieverTrainConfig
    from fid.model_folder import check_retriever
    from fid.training.retriever import train_retriever

    cfg = _load_config(args, RetrieverTrainConfig)
    _check_precision(args, cfg)
    check_retriever(args.init_model)
    result = train_retriever(
        cfg, args.train, args.dev, args.init_model, args.output, args.state_dir, args.device
    )
    logger.info("done: %s", result)


def cmd_build_bm25(args) -> None:
    from fid.bm25 import BM25Config, build_bm25_index

    build_bm25_index(args.passages, args.output, _load_config(args, BM25Config))


def cmd_retrieve_bm25(args) -> None:
    from fid.bm25 import BM25Config, retrieve_bm25
    from fid.fileio import atomic_write_json
    from fid.questions import load_questions

    cfg = _load_config(args, BM25Config)
    questions = load_questions(args.questions)
    records = retrieve_bm25(args.index, args.passages, questions, cfg)
    atomic_write_json(args.output, records)
    logger.info(
        "retrieved %d passages for %d questions into %s", cfg.top_k, len(records), args.output
    )


def _load_retriever(model: Path, question_max_tokens: int, passage_max_tokens: int, device):
    from fid.model_folder import check_retriever
    from fid.retriever import DualEncoder, RetrieverTokenizer

    check_retriever(model)
    retriever, tokenizer = DualEncoder.from_pretrained(model)
    retriever.to(device).eval()
    return retriever, RetrieverTokenizer(tokenizer, question_max_tokens, passage_max_tokens)


def cmd_embed_passages(args) -> None:
    from fid.config import EmbedPassagesConfig
    from fid.dense import embed_passages
    from fid.index import save_embedding_shard
    from fid.passages import iter_passages, passage_shard_bounds

    cfg = _load_config(args, EmbedPassagesConfig)
    start, end = passage_shard_bounds(args.passages, args.shard, args.n_shards)
    device = args.device
    retriever, encode = _load_retriever(args.model, 8, cfg.passage_max_tokens, device)
    embeddings, ids = embed_passages(
        retriever, encode, iter_passages(args.passages, start, end), cfg, device
    )
    save_embedding_shard(
        args.output, embeddings, ids, args.shard, args.n_shards, model=str(args.model)
    )
    logger.info("embedded %d passages (shard %d of %d)", len(ids), args.shard, args.n_shards)


def cmd_build_index(args) -> None:
    from fid.index import IndexConfig, PassageIndex, load_embedding_shards

    cfg = _load_config(args, IndexConfig)
    embeddings, ids, meta = load_embedding_shards(args.shards)
    index = PassageIndex.build(embeddings, ids, cfg, model=meta["model"])
    index.save(args.output)
    logger.info("indexed %d passages (%s) into %s", index.count, cfg.factory, args.output)


def cmd_retrieve(args) -> None:
    from fid import distributed
    from fid.config import RetrieveConfig
    from fid.dense import retrieve
    from fid.fileio import atomic_write_json
    from fid.index import PassageIndex
    from fid.questions import load_questions

    cfg = _load_config(args, RetrieveConfig)
    questions = load_questions(args.questions)
    device = args.device
    retriever, encode = _load_retriever(args.model, cfg.question_max_tokens, 8, device)
    index = PassageIndex.load(args.index, expected_dim=retriever.dim)
    records = retrieve(retriever, encode, index, args.passages, questions, cfg, device)
    if distributed.is_main():
        atomic_write_json(args.output, records)
    logger.info(
        "retrieved %d passages for %d questions into %s", cfg.top_k, len(records), args.output
    )


def cmd_eval_retrieval(args) -> None:
    from fid.config import EvalRetrievalConfig
    from fid.data import DataError, load_examples
    from fid.errors import InputError
    from fid.evaluation import describe_retrieval_accuracy, retrieval_accuracy
    from fid.fileio import atomic_write_json

    cfg = _load_config(args, EvalRetrievalConfig)
    examples = load_examples(args.questions)
    try:
        metrics = retrieval_accuracy(
            [e.answers for e in examples],
            [e.ctxs for e in examples],
            cfg.ks,
            cfg.has_answer_mode,
            cfg.recompute_has_answer,
        )
    except InputError as error:  # an answer of the file is no valid regex (has_answer_mode)
        raise DataError(f"{args.questions}: {error}") from None
    atomic_write_json(args.output, metrics)
    if metrics["n_scored"] == 0:
        logger.warning("no question has gold answers: nothing to score (%s)", args.questions)
        return
    logger.info("retrieval accuracy: %s", describe_retrieval_accuracy(metrics))


def cmd_make_demo_data(args) -> None:
    from fid.demo_data import DemoDataConfig, write_demo_data

    cfg = _load_config(args, DemoDataConfig)
    write_demo_data(cfg, args.output)


def cmd_download(args) -> None:
    from fid.download import DownloadConfig, download_file

    cfg = _load_config(args, DownloadConfig)
    download_file(args.url, args.output, args.checksum, cfg, record_path=args.record)


def cmd_extract(args) -> None:
    from fid.download import extract_file

    extract_file(args.archive, args.output, args.member)


def cmd_prepare_questions(args) -> None:
    from fid.prepare import PrepareQuestionsConfig, prepare_questions

    cfg = _load_config(args, PrepareQuestionsConfig)
    prepare_questions(args.input, args.output, cfg, args.index)


def cmd_eval_baseline(args) -> None:
    from collections import Counter

    from fid.data import DataError
    from fid.evaluation import answer_metrics
    from fid.fileio import atomic_write_json
    from fid.questions import load_questions

    # The answer given most often in training (its first gold answer), for every question.
    counts = Counter(q["answers"][0] for q in load_questions(args.train) if q["answers"])
    if not counts:
        raise DataError(f"{args.train}: no training question has an answer")
    answer, count = counts.most_common(1)[0]
    questions = load_questions(args.questions)
    metrics = answer_metrics([answer] * len(questions), [q["answers"] for q in questions])
    metrics.update(answer=answer, train_count=count, n_questions=len(questions))
    atomic_write_json(args.output, metrics)
    logger.info("most common training answer %r: EM %.2f%% on %s",
                answer, metrics["exact_match"] or 0.0, args.questions)  # fmt: skip


def cmd_make_reader_lists(args) -> None:
    from fid.prepare import ReaderListsConfig, make_reader_lists

    cfg = _load_config(args, ReaderListsConfig)
    make_reader_lists(args.retrieved, args.questions, args.passages, args.output, cfg)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fid", description="Fusion-in-Decoder QA and reader-to-retriever distillation."
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own)")
    parser.add_argument("--log-file", type=Path, help="also append the log to this file")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, func, help_text):
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.add_argument("--config", type=Path, help="YAML of knobs (default: defaults)")
        command.set_defaults(func=func)
        return command

    c = add("init-reader", cmd_init_reader, "Train a tokenizer on a corpus and build a random T5.")
    c.add_argument("--corpus", type=Path, nargs="+", required=True, help="passage TSV / FiD json")
    c.add_argument("--output", type=Path, required=True, help="model folder to write")

    def add_training_paths(command, questions: str, model: str):
        command.add_argument("--train", type=Path, required=True, help=f"training {questions}")
        command.add_argument("--dev", type=Path, required=True, help=f"dev {questions}")
        command.add_argument("--init-model", required=True, help=f"{model} name or folder")
        command.add_argument("--output", type=Path, required=True, help="final model folder")
        command.add_argument(
            "--state-dir", type=Path, required=True, help="checkpoints, logs, metrics (resumed)"
        )

    c = add("train-reader", cmd_train_reader, "Train a FiD reader (resumes from --state-dir).")
    add_training_paths(c, "questions (FiD format)", "T5 to start from:")

    c = add("eval-reader", cmd_eval_reader, "Generate answers; exact match and F1.")
    c.add_argument("--model", type=Path, required=True, help="reader folder")
    c.add_argument("--questions", type=Path, required=True, help="FiD-format questions")
    c.add_argument("--predictions", type=Path, required=True, help="per-question jsonl to write")
    c.add_argument("--metrics", type=Path, required=True, help="metrics json to write")

    c = add("score-passages", cmd_score_passages, "Score read passages by cross-attention.")
    c.add_argument("--model", type=Path, required=True, help="reader folder")
    c.add_argument("--questions", type=Path, required=True, help="FiD-format questions")
    c.add_argument("--output", type=Path, required=True, help="questions with reader_score")

    c = add(
        "convert-checkpoint",
        cmd_convert_checkpoint,
        "Import a released facebookresearch/FiD reader checkpoint.",
    )
    c.add_argument("--checkpoint", type=Path, required=True, help="folder or pytorch_model.bin")
    c.add_argument("--tokenizer", help="tokenizer to save beside it (e.g. t5-base)")
    c.add_argument("--output", type=Path, required=True, help="model folder to write")

    c = add("init-retriever", cmd_init_retriever, "Train a subword tokenizer; build a random BERT.")
    c.add_argument("--corpus", type=Path, nargs="+", required=True, help="passage TSV / FiD json")
    c.add_argument("--output", type=Path, required=True, help="encoder folder to write")

    c = add("train-retriever", cmd_train_retriever, "Distil reader scores into a retriever.")
    add_training_paths(c, "questions scored by the reader", "encoder to start from:")

    c = add("build-bm25", cmd_build_bm25, "Build a BM25 index of a passage file.")
    c.add_argument("--passages", type=Path, required=True, help="DPR-style passage TSV")
    c.add_argument("--output", type=Path, required=True, help="index folder to write")

    c = add("retrieve-bm25", cmd_retrieve_bm25, "Retrieve passages with a BM25 index.")
    c.add_argument("--index", type=Path, required=True, help="folder from build-bm25")
    c.add_argument("--passages", type=Path, required=True, help="the indexed passage TSV")
    c.add_argument("--questions", type=Path, required=True, help="NQ/DPR/TriviaQA/FiD questions")
    c.add_argument("--output", type=Path, required=True, help="FiD-format json to write")

    c = add("embed-passages", cmd_embed_passages, "Embed one shard of a passage file.")
    c.add_argument("--model", type=Path, required=True, help="retriever folder")
    c.add_argument("--passages", type=Path, required=True, help="DPR-style passage TSV")
    c.add_argument("--shard", type=int, default=0, help="this shard (0-based)")
    c.add_argument("--n-shards", type=int, default=1, help="number of shards")
    c.add_argument("--output", type=Path, required=True, help="shard prefix (PREFIX.npy, ...)")

    c = add("build-index", cmd_build_index, "Build a faiss index from embedding shards.")
    c.add_argument("--shards", type=Path, nargs="+", required=True, help="shard prefixes")
    c.add_argument("--output", type=Path, required=True, help="index folder to write")

    c = add("retrieve", cmd_retrieve, "Dense retrieval with a retriever and its index.")
    c.add_argument("--model", type=Path, required=True, help="retriever folder")
    c.add_argument("--index", type=Path, required=True, help="folder from build-index")
    c.add_argument("--passages", type=Path, required=True, help="the indexed passage TSV")
    c.add_argument("--questions", type=Path, required=True, help="NQ/DPR/TriviaQA/FiD questions")
    c.add_argument("--output", type=Path, required=True, help="FiD-format json to write")

    c = add("eval-retrieval", cmd_eval_retrieval, "Top-k retrieval accuracy (DPR has-answer).")
    c.add_argument("--questions", type=Path, required=True, help="FiD-format retrieved questions")
    c.add_argument("--output", type=Path, required=True, help="metrics json to write")

    c = add("make-demo-data", cmd_make_demo_data, "Write the synthetic demo world.")
    c.add_argument("--output", type=Path, required=True, help="folder to write")

    c = add("download", cmd_download, "Download a file: resumable, checksum-verified, atomic.")
    c.add_argument("--url", required=True, help="http(s) or file URL")
    c.add_argument("--checksum", help="sha256:<hex> or md5:<hex> (none: record only)")
    c.add_argument("--output", type=Path, required=True, help="file to write")
    c.add_argument("--record", type=Path, help="json to write with the size and digests")

    c = add("extract", cmd_extract, "Extract one member of a tar(.gz), or a .gz file.")
    c.add_argument("--archive", type=Path, required=True, help="tar, tar.gz or .gz file")
    c.add_argument("--member", help="member path (or unique file name) in a tar archive")
    c.add_argument("--output", type=Path, required=True, help="file to write")

    c = add("prepare-questions", cmd_prepare_questions, "Raw questions into one split (jsonl).")
    c.add_argument("--input", type=Path, required=True, help="NQ-open/TriviaQA/DPR qas/FiD file")
    c.add_argument("--index", type=Path, help="json list of the record positions to keep")
    c.add_argument("--output", type=Path, required=True, help="question jsonl to write")

    c = add("eval-baseline", cmd_eval_baseline, "Exact match of the most common training answer.")
    c.add_argument("--train", type=Path, required=True, help="training questions")
    c.add_argument("--questions", type=Path, required=True, help="questions to score")
    c.add_argument("--output", type=Path, required=True, help="metrics json to write")

    c = add("make-reader-lists", cmd_make_reader_lists, "Retrieved lists with the gold forced in.")
    c.add_argument("--retrieved", type=Path, required=True, help="FiD-format retrieval output")
    c.add_argument("--questions", type=Path, required=True, help="jsonl with gold_passage_id")
    c.add_argument("--passages", type=Path, required=True, help="the passage TSV")
    c.add_argument("--output", type=Path, required=True, help="FiD-format json to write")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `fid` command as a function (tests call it in-process): its exit status."""
    args = build_parser().parse_args(argv)
    if getattr(args, "state_dir", None) is None:
        return _run(args)
    # A training run: SIGUSR1/SIGTERM are recorded, not a kill, from here (before torch is
    # imported) to the end of the run; the loop stops on them with a checkpoint.
    with STOP_SIGNALS:
        return _run(args)


def command() -> None:
    """The `fid` process (console script, `python -m fid`): after a training run it ignores
    SIGUSR1/SIGTERM until it exits, so that a late one during the shutdown is no kill."""
    STOP_SIGNALS.ignore_when_released()
    sys.exit(main())


def _run(args: argparse.Namespace) -> int:
    """Runs one parsed command: its exit status (EXIT_ERROR on bad input, EXIT_PREEMPTED)."""
    from fid import distributed
    from fid.logs import setup_logging
    from fid.training.loop import Preempted

    try:
        info = distributed.init_from_env()
    except distributed.DistributedError as error:
        setup_logging(rank=0)
        logger.error("%s", error)
        return EXIT_ERROR
    log_file = args.log_file
    if log_file is None and getattr(args, "state_dir", None) is not None:
        log_file = args.state_dir / "train.log"
    # Every rank appends to the run log; other ranks log warnings only.
    setup_logging(rank=info.rank, file=log_file)
    _set_threads(args.threads)
    try:
        args.device = distributed.setup(info)
        with _hold_training_state(args):
            args.func(args)
    except Preempted as stop:
        logger.warning("%s: rerun the same command to resume", stop)
        # The checkpoint is written: a SIGTERM from now on (SLURM sends one to the job's tasks
        # on requeue) must not turn the clean exit into a kill.
        STOP_SIGNALS.ignore()
        _requeue_if_asked()
        return EXIT_PREEMPTED
    except Exception as error:  # the command's end: every error gets its message and status
        if _is_input_error(error):
            logger.error("%s", _input_error_message(error, args))
        else:
            logger.error("%s: %s", type(error).__name__, error, exc_info=error)
            logger.error(
                "this is a bug in fid (no input check explains the error above): please report "
                "it with the command line and this traceback"
            )
        return EXIT_ERROR
    finally:
        distributed.cleanup()
    return 0


def _hold_training_state(args: argparse.Namespace):
    """A training run holds its state folder from before its data and models are loaded, so a
    second run on it ends at once (the loop's own hold is then a no-op)."""
    import contextlib

    if getattr(args, "state_dir", None) is None:
        return contextlib.nullcontext()
    from fid.training.state_lock import hold_state

    return hold_state(args.state_dir, args.output)


# Flags that name what a command writes (for errors that do not name the file, like ENOSPC).
OUTPUT_FLAGS = ("output", "predictions", "metrics", "record", "state_dir")
# OSErrors that a user fixes: a path that is missing or of the wrong kind, no permission, no space.
_INPUT_OS_ERRORS = (
    FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError,
)  # fmt: skip
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _is_input_error(error: BaseException) -> bool:
    """Whether an error is the input's fault (one line, exit 1) rather than a bug in fid.

    Every exception class fid defines (DataError, ConfigError, CheckpointError, ... all subclass
    `fid.errors.InputError` or come from an input check) is an input error; so are missing or
    unwritable paths, a full disk and running out of GPU memory.
    """
    module = type(error).__module__
    if module == "fid" or module.startswith("fid."):
        return True
    if isinstance(error, _INPUT_OS_ERRORS):
        return True
    if isinstance(error, OSError) and error.errno in _NO_SPACE:
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(error, torch.cuda.OutOfMemoryError)


def _input_error_message(error: BaseException, args: argparse.Namespace) -> str:
    """One line that names the file (OSErrors raised by writes often carry no file name)."""
    if not isinstance(error, OSError):
        if type(error).__module__.startswith("fid"):
            return str(error)
        return f"{type(error).__name__}: {error}. Hint: lower the batch size or passage count"
    if error.strerror is None:
        return str(error)
    outputs = [str(value) for flag in OUTPUT_FLAGS if (value := getattr(args, flag, None))]
    where = error.filename or ", ".join(outputs) or "the outputs"
    message = f"{where}: {error.strerror}"
    if error.errno in _NO_SPACE:
        message += (
            f" (writing {', '.join(outputs)}: nothing is left under their final names). "
            "Hint: free space there and run the command again"
        )
    return message


def _requeue_if_asked() -> None:
    """With FID_SLURM_REQUEUE=1 inside a SLURM job, rank 0 requeues the job after a
    preemption checkpoint (SLURM then restarts it and training resumes)."""
    import subprocess

    from fid import distributed

    job = os.environ.get("SLURM_JOB_ID")
    if os.environ.get("FID_SLURM_REQUEUE") == "1" and job and distributed.is_main():
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        if result.returncode == 0:
            logger.warning("requeued SLURM job %s", job)
        else:
            logger.error("scontrol requeue %s failed: %s", job, result.stderr.strip())


if __name__ == "__main__":
    sys.exit(main())
