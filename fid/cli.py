"""The `fid` command: one subcommand per workflow step.

Paths come from flags; knobs come from the YAML given by `--config` (defaults in fid/config.py).
This is the only place that parses arguments, sets up logging and turns errors into exit codes:
a bad input ends with one clear message and exit status 1, and no partial output.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger("fid")

EXIT_ERROR = 1


def _device():
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _set_threads(threads: int | None) -> None:
    """Ties torch's CPU threads to what the job was given (2 busy processes on 2 cores with 2
    threads each run many times slower)."""
    if threads is None:
        threads = int(os.environ.get("FID_THREADS", "0")) or None
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def cmd_init_reader(args) -> None:
    from fid.config import InitReaderConfig, load_config
    from fid.corpus import corpus_texts
    from fid.fileio import atomic_directory
    from fid.init_models import init_reader, train_tokenizer

    cfg = load_config(args.config, InitReaderConfig)
    texts = list(corpus_texts(args.corpus))
    tokenizer = train_tokenizer(texts, cfg.vocab_size)
    t5 = init_reader(cfg, vocab_size=len(tokenizer))
    with atomic_directory(args.output) as tmp:
        t5.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    n_params = sum(p.numel() for p in t5.parameters())
    logger.info(
        "wrote a random T5 (%.2fM parameters) and a %d-piece tokenizer trained on %d texts to %s",
        n_params / 1e6,
        len(tokenizer),
        len(texts),
        args.output,
    )


def cmd_train_reader(args) -> None:
    from fid.config import ReaderTrainConfig, load_config
    from fid.training.reader import train_reader

    cfg = load_config(args.config, ReaderTrainConfig)
    result = train_reader(
        cfg, args.train, args.dev, args.init_model, args.output, args.state_dir, _device()
    )
    logger.info("done: %s", result)


def cmd_eval_reader(args) -> None:
    import torch

    from fid.config import EvalReaderConfig, load_config
    from fid.data import ReaderCollator, load_examples
    from fid.evaluation import answer_metrics
    from fid.fileio import atomic_write_json, atomic_write_jsonl
    from fid.inference import generate_answers, prediction_records
    from fid.training.loop import autocast
    from fid.training.reader import load_reader

    cfg = load_config(args.config, EvalReaderConfig)
    examples = load_examples(args.questions)
    device = _device()
    reader, tokenizer = load_reader(str(args.model), cfg.encoder_buckets, cfg.pack_passages)
    reader.to(device).eval()
    collator = ReaderCollator(
        tokenizer, cfg.n_passages, cfg.passage_max_tokens, pad_to_max_length=cfg.pad_to_max_length
    )
    with torch.no_grad(), autocast(device, cfg.precision):
        predictions = generate_answers(
            reader,
            tokenizer,
            collator,
            examples,
            cfg.batch_size,
            cfg.max_answer_tokens,
            cfg.num_beams,
            device,
        )
    metrics = answer_metrics(predictions, [example.answers for example in examples])
    metrics["n_questions"] = len(examples)
    atomic_write_jsonl(args.predictions, prediction_records(examples, predictions))
    atomic_write_json(args.metrics, metrics)
    if metrics["n_scored"] == 0:
        logger.warning("no question has gold answers: wrote predictions only, no metric")
    else:
        logger.info(
            "exact match %.2f, F1 %.2f over %d questions",
            metrics["exact_match"],
            metrics["f1"],
            metrics["n_scored"],
        )


def cmd_score_passages(args) -> None:
    import torch

    from fid.config import ScorePassagesConfig, load_config
    from fid.data import ReaderCollator, load_examples
    from fid.fileio import atomic_write_json
    from fid.inference import score_passages, with_reader_scores
    from fid.training.loop import autocast
    from fid.training.reader import load_reader

    cfg = load_config(args.config, ScorePassagesConfig)
    examples = load_examples(args.questions)
    device = _device()
    reader, tokenizer = load_reader(str(args.model), cfg.encoder_buckets, cfg.pack_passages)
    reader.to(device).eval()
    collator = ReaderCollator(
        tokenizer, cfg.n_passages, cfg.passage_max_tokens, pad_to_max_length=cfg.pad_to_max_length
    )
    with torch.no_grad(), autocast(device, cfg.precision):
        scores = score_passages(reader, collator, examples, cfg.batch_size, cfg.mode, device)
    records = [
        with_reader_scores(example, example_scores, cfg.mode, cfg.n_passages)
        for example, example_scores in zip(examples, scores, strict=True)
    ]
    atomic_write_json(args.output, records)
    logger.info("scored %d questions (%s) into %s", len(records), cfg.mode, args.output)


def cmd_convert_checkpoint(args) -> None:
    from fid.convert import convert_reader_checkpoint

    convert_reader_checkpoint(args.checkpoint, args.output, tokenizer=args.tokenizer)


def cmd_make_demo_data(args) -> None:
    from fid.config import load_config
    from fid.demo_data import DemoDataConfig, write_demo_data

    cfg = load_config(args.config, DemoDataConfig)
    write_demo_data(cfg, args.output)


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

    c = add("train-reader", cmd_train_reader, "Train a FiD reader (resumes from --state-dir).")
    c.add_argument("--train", type=Path, required=True, help="FiD-format training questions")
    c.add_argument("--dev", type=Path, required=True, help="FiD-format dev questions")
    c.add_argument("--init-model", required=True, help="T5 name or folder to start from")
    c.add_argument("--output", type=Path, required=True, help="final model folder")
    c.add_argument("--state-dir", type=Path, required=True, help="checkpoints, logs, metrics")

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

    c = add("make-demo-data", cmd_make_demo_data, "Write the synthetic demo world.")
    c.add_argument("--output", type=Path, required=True, help="folder to write")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from fid.logs import setup_logging

    log_file = args.log_file
    if log_file is None and getattr(args, "state_dir", None) is not None:
        log_file = args.state_dir / "train.log"
    setup_logging(rank=0, file=log_file)
    _set_threads(args.threads)
    from fid.config import ConfigError
    from fid.data import DataError

    try:
        args.func(args)
    except (ConfigError, DataError, FileNotFoundError) as error:
        logger.error("%s", error)
        return EXIT_ERROR
    except (OSError, ValueError) as error:
        logger.error("%s: %s", type(error).__name__, error)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
