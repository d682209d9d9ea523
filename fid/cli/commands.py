"""One handler per `fid` subcommand: load the command's config, call the one function of the
package that does the step, with the paths from the flags.

A handler holds no logic of its own: what the command does lives in the stage package named in
its import (rule `train_reader` <-> `fid train-reader` <-> `fid.training.reader.train_reader`).
Imports are local, so that `fid --help` and light commands do not import torch.
"""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger("fid")


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


def _device_config(args: argparse.Namespace, config_class):
    """The knobs of a command that runs a model: fp16 autocast exists on CUDA only, so it is
    refused on other devices before any model is loaded."""
    from fid.config import ConfigError

    cfg = _load_config(args, config_class)
    if cfg.precision == "fp16" and args.device.type != "cuda":
        raise ConfigError(
            f"{args.config}: precision = 'fp16' needs a CUDA device, but this job runs on "
            f"{args.device.type}: expected bf16 or fp32 (or auto) there"
        )
    return cfg


# ---------------------------------------------------------------- data


def download(args) -> None:
    from fid.config import DownloadConfig
    from fid.data.download import download

    cfg = _load_config(args, DownloadConfig)
    download(args.url, args.output, args.checksum, cfg, record_path=args.record)


def extract(args) -> None:
    from fid.data.download import extract

    extract(args.archive, args.output, args.member)


def prepare_questions(args) -> None:
    from fid.config import PrepareQuestionsConfig
    from fid.data.prepare import prepare_questions

    prepare_questions(
        args.input, args.output, _load_config(args, PrepareQuestionsConfig), args.index
    )


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
    from fid.training.reader import train_reader

    cfg = _device_config(args, ReaderTrainConfig)
    result = train_reader(
        cfg, args.train, args.dev, args.init_model, args.output, args.state_dir, args.device
    )
    logger.info("done: %s", result)


def eval_reader(args) -> None:
    from fid.config import EvalReaderConfig
    from fid.evaluation.reader import eval_reader

    cfg = _device_config(args, EvalReaderConfig)
    eval_reader(cfg, args.model, args.questions, args.predictions, args.metrics, args.device)


def score_passages(args) -> None:
    from fid.config import ScorePassagesConfig
    from fid.inference.scoring import score_passages

    cfg = _device_config(args, ScorePassagesConfig)
    score_passages(cfg, args.model, args.questions, args.output, args.device)


def convert_checkpoint(args) -> None:
    from fid.models.convert import convert_checkpoint

    convert_checkpoint(args.checkpoint, args.output, tokenizer=args.tokenizer)


def eval_baseline(args) -> None:
    from fid.evaluation.baseline import eval_baseline

    eval_baseline(args.train, args.questions, args.output)


# ---------------------------------------------------------------- retrieval


def train_retriever(args) -> None:
    from fid.config import RetrieverTrainConfig
    from fid.training.retriever import train_retriever

    cfg = _device_config(args, RetrieverTrainConfig)
    result = train_retriever(
        cfg, args.train, args.dev, args.init_model, args.output, args.state_dir, args.device
    )
    logger.info("done: %s", result)


def build_bm25(args) -> None:
    from fid.config import BM25Config
    from fid.retrieval.bm25 import build_bm25

    build_bm25(args.passages, args.output, _load_config(args, BM25Config))


def retrieve_bm25(args) -> None:
    from fid.config import BM25Config
    from fid.retrieval.bm25 import retrieve_bm25

    cfg = _load_config(args, BM25Config)
    retrieve_bm25(cfg, args.index, args.passages, args.questions, args.output)


def embed_passages(args) -> None:
    from fid.config import EmbedPassagesConfig
    from fid.retrieval.embeddings import embed_passages

    cfg = _device_config(args, EmbedPassagesConfig)
    embed_passages(
        cfg, args.model, args.passages, args.shard, args.n_shards, args.output, args.device
    )


def build_index(args) -> None:
    from fid.config import IndexConfig
    from fid.retrieval.index import build_index

    build_index(_load_config(args, IndexConfig), args.shards, args.output)


def retrieve(args) -> None:
    from fid.config import RetrieveConfig
    from fid.retrieval.dense import retrieve

    cfg = _device_config(args, RetrieveConfig)
    retrieve(cfg, args.model, args.index, args.passages, args.questions, args.output, args.device)


def eval_retrieval(args) -> None:
    from fid.config import EvalRetrievalConfig
    from fid.evaluation.retrieval import eval_retrieval

    eval_retrieval(_load_config(args, EvalRetrievalConfig), args.questions, args.output)
