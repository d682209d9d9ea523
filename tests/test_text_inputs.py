"""Every text input of every `fid` command, given a byte that is not UTF-8 and given a UTF-8
byte-order mark (fid.text_files: the one way fid decodes the text it reads).

A bad byte (0xff) in a data line ends the command with exit status 1 and one error line that
names the file, the line and the byte offset: no traceback, no "bug in fid", nothing under the
output's name. A byte-order mark at the start of a file is dropped: the command gives the same
result as without it; the files that transformers reads after fid (a model folder's
config.json) refuse it, in one line that says so.

Each command runs once on good inputs (its reference); each probe then copies one input (a
file, or the folder that holds it) with the byte put in, and runs the command in-process on
the copy. Inputs, models and indexes are built once for the module. The inputs read line by
line are also given CRLF line endings (the same result), and the reader itself is checked on
the offsets it names.

Not walked: `extract` (archives) and `copy-packaged-model` read no text file; `ask` reads
its questions from its arguments or stdin, not a file; `convert-lists`, `convert-checkpoint`,
`build-passage-store` and `eval-baseline` take `--config` but never read it.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import json
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml
from transformers import T5ForConditionalGeneration

from fid.cli import main
from fid.data.questions import load_questions
from fid.errors import DataError
from fid.models.settings import ReaderSettings
from fid.text_files import read_text, text_lines

BOM = codecs.BOM_UTF8
BAD = b"\xff"


# --- the inputs, built once ------------------------------------------------------------------


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _yaml(path: Path, knobs: dict) -> Path:
    """A config with a comment line (line 2), where a probe puts its byte."""
    text = yaml.safe_dump(knobs) if knobs else "{}\n"
    path.write_text(text.rstrip("\n") + "\n# knobs of this test\n", encoding="utf-8")
    return path


def _run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, toy_world, toy_records, tiny_model_dir) -> Path:
    """Every file the commands read: passages (TSV and store), questions in each format, FiD
    and compact lists, configs, a reader, a retriever, a BM25 and a dense index, a run."""
    i = tmp_path_factory.mktemp("inputs")
    with open(i / "psgs.tsv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        writer.writerows([p.id, p.text, p.title] for p in toy_world.passages)
    dev = [{k: v for k, v in r.items() if k != "gold_passage_id"} for r in toy_records["dev"][:3]]
    train = [
        {k: v for k, v in r.items() if k != "gold_passage_id"} for r in toy_records["train"][:4]
    ]
    _jsonl(i / "dev.jsonl", dev)
    _jsonl(i / "train.jsonl", train)
    scored = [dict(r, ctxs=[dict(c, reader_score=float(-k)) for k, c in enumerate(r["ctxs"])])
              for r in train]  # fmt: skip
    _jsonl(i / "scored.jsonl", scored)
    # make-reader-lists: the gold passage left out of the lists, so it is read from the TSV
    gold = toy_records["dev"][:3]
    _jsonl(
        i / "gold.jsonl", [{"id": r["id"], "gold_passage_id": r["gold_passage_id"]} for r in gold]
    )
    without_gold = [
        dict(r, ctxs=[c for c in r["ctxs"] if c["id"] != g["gold_passage_id"]])
        for r, g in zip(dev, gold, strict=True)
    ]
    _jsonl(i / "retrieved.jsonl", without_gold)
    questions = [{"question": r["question"], "answer": r["answers"]} for r in toy_records["dev"]]
    _jsonl(i / "nq.jsonl", questions[:4])
    (i / "qas.tsv").write_text(
        "".join(f"{q['question']}\t{q['answer']!r}\n" for q in questions[:4]), encoding="utf-8"
    )
    trivia = {"Data": [{"Question": q["question"], "QuestionId": f"tq{k}",
                        "Answer": {"Aliases": q["answer"], "Value": q["answer"][0]}}
                       for k, q in enumerate(questions[:4])]}  # fmt: skip
    (i / "tqa.json").write_text(json.dumps(trivia, indent=1), encoding="utf-8")
    (i / "idx.json").write_text("[\n 2,\n 0\n]\n", encoding="utf-8")
    configs = {
        "empty": {},
        "init": dict(vocab_size=200, d_model=16, d_ff=32, d_kv=8, num_layers=1,
                     num_decoder_layers=1, num_heads=2),
        "init_retriever": dict(vocab_size=200, hidden_size=16, num_layers=1, num_heads=2,
                               intermediate_size=32),
        "reader": dict(n_passages=3, passage_max_tokens=32, batch_size_per_device=2, max_steps=2,
                       warmup_steps=1, eval_every_steps=2, save_every_steps=2, log_every_steps=1,
                       eval_batch_size=4, max_new_tokens=3, tensorboard=False, dropout=0.0),
        "retriever": dict(n_passages=3, batch_size_per_device=2, max_steps=2, warmup_steps=1,
                          eval_k=[1], select_on="candidate_agreement@1", eval_every_steps=2,
                          save_every_steps=2, tensorboard=False, projection_dim=8,
                          project_tokens=False),
        "eval_reader": dict(n_passages=3, max_new_tokens=3),
        "retrieve": dict(top_k=3),
        "compact": dict(top_k=3, list_format="compact"),
        "world": dict(n_entities=6, n_dev_facts=3, n_test_facts=3),
        "scale": dict(scale=0.0001, n_passages=60, n_train=4, n_dev=2, n_test=2),
        "download": dict(retries=0),
    }  # fmt: skip
    for name, knobs in configs.items():
        _yaml(i / f"{name}.yaml", knobs)

    assert _run("build-passage-store", "--passages", i / "psgs.tsv", "--output", i / "store") == 0
    for name in ("dev", "train"):
        assert _run("convert-lists", "--input", i / f"{name}.jsonl", "--passages", i / "store",
                    "--output", i / f"{name}_lists.jsonl") == 0  # fmt: skip
    # Lists that record no corpus, so that a copy of the TSV (another sha256) may read them.
    header, *lines = (i / "dev_lists.jsonl").read_text().splitlines(keepends=True)
    header = json.dumps({**json.loads(header), "corpus": None}) + "\n"
    (i / "dev_lists_any_corpus.jsonl").write_text(header + "".join(lines), encoding="utf-8")
    assert _run("init-retriever", "--config", i / "init_retriever.yaml", "--corpus",
                i / "psgs.tsv", "--output", i / "encoder") == 0  # fmt: skip
    _dual_encoder(i / "encoder", i / "retriever")
    assert _run("build-bm25", "--passages", i / "psgs.tsv", "--output", i / "bm25") == 0
    assert _run("embed-passages", "--model", i / "retriever", "--passages", i / "psgs.tsv",
                "--output", i / "shards" / "shard0") == 0  # fmt: skip
    assert _run("build-index", "--shards", i / "shards" / "shard0", "--output", i / "index") == 0
    shutil.copytree(tiny_model_dir, i / "reader")
    # A run folder as the workflow writes it, for `fid ask --run`: its system is round 1's
    # reader with round 0's retriever and index (fid.evaluation.run_system).
    run = i / "results" / "run"
    for name, target in (("iter1/reader/model", i / "reader"),
                         ("iter0/retriever/model", i / "retriever"),
                         ("iter0/index", i / "index")):  # fmt: skip
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).symlink_to(target)
    (run / "config").mkdir()
    shutil.copy(i / "eval_reader.yaml", run / "config" / "eval_reader.yaml")
    shutil.copy(i / "retrieve.yaml", run / "config" / "retrieve.yaml")
    (run / "report").mkdir()
    _yaml(run / "report" / "config.yaml", {"data": {"passages": str(i / "psgs.tsv")}})
    (i / "psgs.tsv.gz").write_bytes(gzip.compress((i / "psgs.tsv").read_bytes()))
    ReaderSettings(passage_max_tokens=32, n_passages=3).save(i / "reader")
    _released_checkpoint(i / "reader", i / "released")
    return i


def _dual_encoder(encoder: Path, folder: Path) -> None:
    """A DualEncoder folder (dual_encoder.json, question_encoder/, head) around an encoder."""
    from transformers import AutoModel, AutoTokenizer

    from fid.models.retriever import DualEncoder, DualEncoderSpec

    model = DualEncoder(AutoModel.from_pretrained(encoder), None, DualEncoderSpec(projection_dim=8))
    model.save_pretrained(folder, tokenizer=AutoTokenizer.from_pretrained(encoder))


def _released_checkpoint(reader: Path, folder: Path) -> None:
    """A reader in the layout of facebookresearch/FiD's released checkpoints."""
    t5 = T5ForConditionalGeneration.from_pretrained(reader)
    released = {}
    for key, value in t5.state_dict().items():
        if key.startswith("encoder."):  # FiD's wrapper: encoder.encoder.block.N.module.
            key = "encoder." + re.sub(r"^encoder\.block\.(\d+)\.", r"encoder.block.\1.module.", key)
        released[key] = value.clone()
    folder.mkdir()
    torch.save(released, folder / "pytorch_model.bin")
    t5.config.to_json_file(folder / "config.json")


# --- the commands and their text inputs --------------------------------------------------------


def _files(*names: str, drop: dict[str, tuple[str, ...]] | None = None) -> Callable[[Path], dict]:
    """The result to compare: these outputs' bytes (a folder: each file's), but for the json
    files in `drop`, compared without the keys named there (timings, an input's path)."""
    drop = drop or {}

    def result(out: Path) -> dict:
        found = {}
        for name in names:
            path = out / name
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for file in files:
                relative = str(file.relative_to(out))
                found[relative] = file.read_bytes()
                if relative in drop:
                    data = json.loads(found[relative])
                    found[relative] = {k: v for k, v in data.items() if k not in drop[relative]}
        return found

    return result


def _lines_after_header(name: str) -> Callable[[Path], list[str]]:
    """Compact lists without their header (it holds the corpus file's sha256)."""
    return lambda out: (out / name).read_text().splitlines()[1:]


def _store(name: str) -> Callable[[Path], list]:
    """A passage store by what it gives: every passage, by id."""

    def result(out: Path) -> list:
        from fid.data.passage_store import open_store

        store = open_store(out / name)
        ids = [i.decode() for i in store._ids]
        return store.get(ids)

    return result


@dataclass
class Command:
    """A command on the good inputs, its outputs under "{out}" and what a BOM must not change."""

    argv: list
    outputs: list[str]
    result: Callable[[Path], object] | None = None  # None: the outputs' bytes
    stdout: bool = False  # the result is what it prints (fid ask)

    def line(self, out: Path) -> list[str]:
        return [str(a).replace("{out}", str(out)) for a in self.argv]

    def result_of(self, out: Path, printed: str) -> object:
        if self.stdout:
            return printed
        return (self.result or _files(*self.outputs))(out)


def commands(i: Path) -> dict[str, Command]:
    """Every `fid` command that reads a text file, on the good inputs."""
    model, passages, store = i / "reader", i / "psgs.tsv", i / "store"
    weights = "model/model.safetensors"
    # fmt: off
    return {
        "init-reader": Command(
            ["init-reader", "--config", i / "init.yaml", "--corpus", passages, i / "dev.jsonl",
             i / "dev_lists.jsonl", "--output", "{out}/model"], ["model"]),
        "init-retriever": Command(
            ["init-retriever", "--config", i / "init_retriever.yaml", "--corpus", passages,
             "--output", "{out}/model"], ["model"]),
        "train-reader": Command(
            ["train-reader", "--config", i / "reader.yaml", "--train", i / "train.jsonl",
             "--dev", i / "dev.jsonl", "--init-model", model, "--output", "{out}/model",
             "--state-dir", "{out}/state"], ["model"], _files(weights)),
        "train-reader (compact lists)": Command(
            ["train-reader", "--config", i / "reader.yaml", "--train", i / "train_lists.jsonl",
             "--dev", i / "dev_lists.jsonl", "--passages", store, "--init-model", model,
             "--output", "{out}/model", "--state-dir", "{out}/state"], ["model"], _files(weights)),
        "train-retriever": Command(
            ["train-retriever", "--config", i / "retriever.yaml", "--train", i / "scored.jsonl",
             "--dev", i / "scored.jsonl", "--init-model", i / "retriever", "--output",
             "{out}/model", "--state-dir", "{out}/state"], ["model"],
            _files("model/question_encoder/model.safetensors")),
        "eval-reader": Command(
            ["eval-reader", "--config", i / "eval_reader.yaml", "--model", model, "--questions",
             i / "dev.jsonl", "--predictions", "{out}/p.jsonl", "--metrics", "{out}/m.json"],
            ["p.jsonl", "m.json"], _files("p.jsonl")),
        "eval-reader (compact lists)": Command(
            ["eval-reader", "--model", model, "--questions", i / "dev_lists_any_corpus.jsonl",
             "--passages", passages, "--predictions", "{out}/p.jsonl", "--metrics", "{out}/m.json"],
            ["p.jsonl", "m.json"], _files("p.jsonl")),
        "score-passages": Command(
            ["score-passages", "--config", i / "empty.yaml", "--model", model, "--questions",
             i / "dev.jsonl", "--output", "{out}/s.json"], ["s.json"]),
        "convert-checkpoint": Command(
            ["convert-checkpoint", "--checkpoint", i / "released",
             "--output", "{out}/model"], ["model"], _files(weights)),
        "build-bm25": Command(
            ["build-bm25", "--config", i / "empty.yaml", "--passages", passages, "--output",
             "{out}/bm25"], ["bm25"],
            _files("bm25", drop={"bm25/meta.json": ("source",)})),
        "retrieve-bm25": Command(
            ["retrieve-bm25", "--config", i / "retrieve.yaml", "--index", i / "bm25", "--passages",
             passages, "--questions", i / "nq.jsonl", "--output", "{out}/r.json"], ["r.json"]),
        "retrieve-bm25 (store)": Command(
            ["retrieve-bm25", "--config", i / "compact.yaml", "--index", i / "bm25", "--passages",
             store, "--questions", i / "qas.tsv", "--output", "{out}/r.jsonl"], ["r.jsonl"]),
        "retrieve-bm25 (TriviaQA)": Command(
            ["retrieve-bm25", "--index", i / "bm25", "--passages", passages, "--questions",
             i / "tqa.json", "--output", "{out}/r.json"], ["r.json"]),
        "embed-passages": Command(
            ["embed-passages", "--config", i / "empty.yaml", "--model", i / "retriever",
             "--passages", passages, "--output", "{out}/shard0"],
            ["shard0.npy", "shard0.ids.npy", "shard0.json"],
            _files("shard0.npy", "shard0.ids.npy")),
        "embed-passages (shard 2 of 2)": Command(
            ["embed-passages", "--model", i / "retriever", "--passages", passages, "--shard", 1,
             "--n-shards", 2, "--output", "{out}/shard1"],
            ["shard1.npy", "shard1.ids.npy", "shard1.json"],
            _files("shard1.npy", "shard1.ids.npy")),
        "build-index": Command(
            ["build-index", "--config", i / "empty.yaml", "--shards", i / "shards/shard0",
             "--output", "{out}/index"], ["index"],
            _files("index", drop={"index/meta.json": ("build_seconds",)})),
        "retrieve": Command(
            ["retrieve", "--config", i / "retrieve.yaml", "--model", i / "retriever", "--index",
             i / "index", "--passages", passages, "--questions", i / "nq.jsonl", "--output",
             "{out}/d.json"], ["d.json"]),
        "eval-retrieval": Command(
            ["eval-retrieval", "--config", i / "empty.yaml", "--questions", i / "dev.jsonl",
             "--output", "{out}/m.json"], ["m.json"]),
        "eval-retrieval (compact lists)": Command(
            ["eval-retrieval", "--questions", i / "dev_lists.jsonl", "--passages", store,
             "--output", "{out}/m.json"], ["m.json"]),
        "build-passage-store": Command(
            ["build-passage-store", "--passages", passages,
             "--output", "{out}/store"], ["store"], _store("store")),
        "convert-lists": Command(
            ["convert-lists", "--input", i / "dev_lists.jsonl",
             "--passages", store, "--output", "{out}/fid.json"], ["fid.json"]),
        "convert-lists (FiD json, TSV)": Command(
            ["convert-lists", "--input", i / "dev.jsonl", "--passages", passages, "--output",
             "{out}/lists.jsonl"], ["lists.jsonl"], _lines_after_header("lists.jsonl")),
        "make-demo-data": Command(
            ["make-demo-data", "--config", i / "world.yaml", "--output", "{out}/world"],
            ["world"]),
        "make-scale-data": Command(
            ["make-scale-data", "--config", i / "scale.yaml", "--output", "{out}/scale"],
            ["scale"], _files("scale", drop={"scale/stats.json": ("seconds",)})),
        "download": Command(
            ["download", "--config", i / "download.yaml", "--url", (i / "psgs.tsv.gz").as_uri(),
             "--output", "{out}/f.gz"], ["f.gz"]),
        "prepare-questions": Command(
            ["prepare-questions", "--config", i / "empty.yaml", "--input", i / "nq.jsonl",
             "--index", i / "idx.json", "--output", "{out}/q.jsonl"], ["q.jsonl"]),
        "prepare-questions (DPR qas TSV)": Command(
            ["prepare-questions", "--input", i / "qas.tsv", "--output", "{out}/q.jsonl"],
            ["q.jsonl"]),
        "prepare-questions (TriviaQA, FiD)": Command(
            ["prepare-questions", "--input", i / "tqa.json", "--output", "{out}/q.jsonl"],
            ["q.jsonl"]),
        "eval-baseline": Command(
            ["eval-baseline", "--train", i / "train.jsonl",
             "--questions", i / "dev.jsonl", "--output", "{out}/b.json"], ["b.json"]),
        "make-reader-lists": Command(
            ["make-reader-lists", "--config", i / "empty.yaml", "--retrieved",
             i / "retrieved.jsonl", "--questions", i / "gold.jsonl", "--passages", passages,
             "--output", "{out}/l.json"], ["l.json"]),
        "ask": Command(
            ["ask", "--config", i / "eval_reader.yaml", "--reader", model, "--retriever",
             i / "retriever", "--index", i / "index", "--passages", passages,
             "Who governs Stolria?"], [], stdout=True),
        "ask --run": Command(["ask", "--run", i / "results/run", "Who governs Stolria?"], [],
                             stdout=True),
    }
    # fmt: on


@dataclass(frozen=True)
class Probe:
    """One text input of one command and where the bad byte goes in it.

    Attributes:
        command: a key of `commands`.
        path: the input as the command line names it, relative to the inputs folder.
        inner: the file inside that folder that is probed ("": `path` is the file).
        marker: the byte goes right after the first `marker` in line `line` or later.
        line: where the search for `marker` starts (1-based).
        bom: "same" (a BOM is dropped: the same result) or "refused" (one line says so).
    """

    command: str
    path: str
    inner: str = ""
    marker: bytes = b'"'
    line: int = 1
    bom: str = "same"

    @property
    def id(self) -> str:
        return f"{self.command}:{Path(self.path, self.inner)}"


TSV = dict(marker=b"\t", line=2)  # the first passage's text
QUESTION = dict(marker=b'"question": "', line=2)  # the second record's question
COMPACT = dict(marker=b'"question": "', line=2)  # the first question (line 1: the header)
YAML = dict(marker=b"# knobs ")  # the comment line
CONFIG_JSON = dict(inner="config.json", bom="refused")  # transformers reads it after fid
# fmt: off
PROBES = [
    Probe("convert-lists", "dev_lists.jsonl", **COMPACT),  # issue 23
    Probe("convert-lists", "store", "store.json"),
    Probe("convert-lists (FiD json, TSV)", "dev.jsonl", **QUESTION),
    Probe("convert-lists (FiD json, TSV)", "psgs.tsv", **TSV),
    Probe("init-reader", "psgs.tsv", **TSV),
    Probe("init-reader", "dev.jsonl", **QUESTION),
    Probe("init-reader", "dev_lists.jsonl", **COMPACT),
    Probe("init-reader", "init.yaml", **YAML),
    Probe("init-retriever", "psgs.tsv", **TSV),
    Probe("init-retriever", "init_retriever.yaml", **YAML),
    Probe("train-reader", "train.jsonl", **QUESTION),
    Probe("train-reader", "dev.jsonl", **QUESTION),
    Probe("train-reader", "reader.yaml", **YAML),
    Probe("train-reader", "reader", **CONFIG_JSON),
    Probe("train-reader (compact lists)", "train_lists.jsonl", **COMPACT),
    Probe("train-reader (compact lists)", "dev_lists.jsonl", **COMPACT),
    Probe("train-retriever", "scored.jsonl", **QUESTION),
    Probe("train-retriever", "retriever.yaml", **YAML),
    Probe("train-retriever", "retriever", "dual_encoder.json"),
    Probe("eval-reader", "dev.jsonl", **QUESTION),
    Probe("eval-reader", "eval_reader.yaml", **YAML),
    Probe("eval-reader", "reader", **CONFIG_JSON),
    Probe("eval-reader", "reader", "fid_reader.json"),
    Probe("eval-reader (compact lists)", "dev_lists_any_corpus.jsonl", **COMPACT),
    Probe("eval-reader (compact lists)", "psgs.tsv", **TSV),
    Probe("score-passages", "dev.jsonl", **QUESTION),
    Probe("score-passages", "empty.yaml", **YAML),
    Probe("convert-checkpoint", "released", "config.json"),
    Probe("build-bm25", "psgs.tsv", **TSV),
    Probe("build-bm25", "empty.yaml", **YAML),
    Probe("retrieve-bm25", "nq.jsonl", **QUESTION),
    Probe("retrieve-bm25", "psgs.tsv", **TSV),
    Probe("retrieve-bm25", "bm25", "meta.json"),
    Probe("retrieve-bm25", "retrieve.yaml", **YAML),
    Probe("retrieve-bm25 (store)", "qas.tsv", marker=b"", line=2),
    Probe("retrieve-bm25 (store)", "store", "store.json"),
    Probe("retrieve-bm25 (TriviaQA)", "tqa.json", marker=b'"Question": "', line=3),
    Probe("embed-passages", "psgs.tsv", **TSV),
    Probe("embed-passages", "retriever", "dual_encoder.json"),
    Probe("embed-passages", "retriever", "question_encoder/config.json", bom="refused"),
    Probe("embed-passages", "empty.yaml", **YAML),
    Probe("embed-passages (shard 2 of 2)", "psgs.tsv", marker=b"\t", line=90),
    Probe("build-index", "shards", "shard0.json"),
    Probe("build-index", "empty.yaml", **YAML),
    Probe("retrieve", "nq.jsonl", **QUESTION),
    Probe("retrieve", "psgs.tsv", **TSV),
    Probe("retrieve", "index", "meta.json"),
    Probe("retrieve", "retrieve.yaml", **YAML),
    Probe("eval-retrieval", "dev.jsonl", **QUESTION),
    Probe("eval-retrieval", "empty.yaml", **YAML),
    Probe("eval-retrieval (compact lists)", "dev_lists.jsonl", **COMPACT),
    Probe("build-passage-store", "psgs.tsv", **TSV),
    Probe("make-demo-data", "world.yaml", **YAML),
    Probe("make-scale-data", "scale.yaml", **YAML),
    Probe("download", "download.yaml", **YAML),
    Probe("prepare-questions", "nq.jsonl", **QUESTION),
    Probe("prepare-questions", "idx.json", marker=b" ", line=3),
    Probe("prepare-questions", "empty.yaml", **YAML),
    Probe("prepare-questions (DPR qas TSV)", "qas.tsv", marker=b"", line=2),
    Probe("prepare-questions (TriviaQA, FiD)", "tqa.json", marker=b'"Question": "', line=3),
    Probe("eval-baseline", "train.jsonl", **QUESTION),
    Probe("eval-baseline", "dev.jsonl", **QUESTION),
    Probe("make-reader-lists", "retrieved.jsonl", **QUESTION),
    Probe("make-reader-lists", "gold.jsonl", marker=b'"gold_passage_id": "', line=2),
    Probe("make-reader-lists", "psgs.tsv", **TSV),
    Probe("make-reader-lists", "empty.yaml", **YAML),
    Probe("ask", "psgs.tsv", **TSV),
    Probe("ask", "eval_reader.yaml", **YAML),
    Probe("ask --run", "results/run", "config/eval_reader.yaml", **YAML),
    Probe("ask --run", "results/run", "config/retrieve.yaml", **YAML),
    Probe("ask --run", "results/run", "report/config.yaml", **YAML),
]
# fmt: on


# The commands that read passages through a dense index (which records its corpus).
DENSE = ("retrieve", "ask")


@dataclass
class Outcome:
    status: int
    errors: list[logging.LogRecord]
    log: str
    printed: str


def _outcome(argv: list[str], caplog, capsys) -> Outcome:
    caplog.clear()
    capsys.readouterr()
    with caplog.at_level(logging.INFO):
        status = main(argv)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    return Outcome(status, errors, caplog.text, capsys.readouterr().out)


@dataclass
class Runner:
    """Runs the commands, a command's reference (good inputs) once for the module."""

    inputs: Path
    root: Path
    references: dict[str, object] = field(default_factory=dict)

    def copy(self, probe: Probe, content: Callable[[bytes], bytes], name: str) -> Path:
        """A copy of the probe's input (file or folder) whose probed file's bytes are
        `content(bytes)`; returns the probed file of the copy."""
        source, target = self.inputs / probe.path, self.root / name / probe.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy(source, target)
        changed = target / probe.inner
        changed.write_bytes(content(changed.read_bytes()))
        return changed

    def run(self, name: str, out: Path, caplog, capsys, probe: Probe | None = None, copy=""):
        """Runs command `name` writing under `out`, the probe's input replaced by its copy
        in the folder `copy` (a path that starts with the input's is replaced too)."""
        command = commands(self.inputs)[name]
        argv = command.line(out)
        replaced = {}
        if probe is not None:
            replaced[str(self.inputs / probe.path)] = str(self.root / copy / probe.path)
            if probe.command in DENSE and probe.path == "psgs.tsv":
                replaced[str(self.inputs / "index")] = str(self._index_of(probe, copy))
        for old, new in replaced.items():
            argv = [new + a[len(old):] if a == old or a.startswith(old + "/") else a
                    for a in argv]  # fmt: skip
        return command, _outcome(argv, caplog, capsys)

    def _index_of(self, probe: Probe, copy: str) -> Path:
        """The index with the probed passage file's identity recorded as its corpus: a dense
        command refuses a passage file other than the one embedded (size and sampled sha256,
        fid.retrieval.index_sources), so the text it then decodes is reached as for a change
        that the sampled hash cannot see (a byte in the middle of a large corpus)."""
        from fid.data.passage_store import passages_identity

        index = self.root / copy / "index"
        if not index.exists():
            shutil.copytree(self.inputs / "index", index)
            meta = json.loads((index / "meta.json").read_text())
            meta["corpus"] = passages_identity(self.root / copy / probe.path)
            (index / "meta.json").write_text(json.dumps(meta))
        return index

    def reference(self, name: str, caplog, capsys) -> object:
        if name not in self.references:
            out = self.root / "reference" / name
            command, outcome = self.run(name, out, caplog, capsys)
            assert outcome.status == 0, (name, outcome.log[-3000:])
            self.references[name] = command.result_of(out, outcome.printed)
        return self.references[name]


@pytest.fixture(scope="module")
def runner(inputs, tmp_path_factory) -> Runner:
    return Runner(inputs, tmp_path_factory.mktemp("runs"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _folder(kind: str, probe: Probe) -> str:
    return re.sub(r"[^\w.-]+", "_", f"{kind}-{probe.id}")


def _with_bad_byte(probe: Probe, data: bytes) -> tuple[bytes, int, int]:
    """The bytes with 0xff put after the probe's marker: (bytes, line, byte offset)."""
    start = 0
    for _ in range(probe.line - 1):
        start = data.index(b"\n", start) + 1
    at = data.index(probe.marker, start) + len(probe.marker)
    return data[:at] + BAD + data[at:], data.count(b"\n", 0, at) + 1, at


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.id)
def test_a_byte_that_is_not_utf8_is_one_line_naming_file_line_and_offset(
    probe, runner, caplog, capsys
):
    original = (runner.inputs / probe.path / probe.inner).read_bytes()
    bad, line, offset = _with_bad_byte(probe, original)
    name = _folder("bad", probe)
    changed = runner.copy(probe, lambda _: bad, name)
    out = runner.root / name / "out"
    command, outcome = runner.run(probe.command, out, caplog, capsys, probe, name)
    said = "\n".join(r.getMessage() for r in outcome.errors)
    assert outcome.status == 1, (probe.id, outcome.log[-3000:])
    assert len(outcome.errors) == 1, (probe.id, said)
    for expected in (f"{changed}: line {line}: not UTF-8",
                     f"byte 0xff at byte offset {offset}"):  # fmt: skip
        assert expected in said, (probe.id, expected, said)
    assert outcome.errors[0].exc_info is None, probe.id
    assert "Traceback" not in outcome.log and "bug in fid" not in outcome.log, probe.id
    for output in command.outputs:
        assert not (out / output).exists(), (probe.id, output)


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.id)
def test_a_byte_order_mark_is_dropped_or_refused_in_one_line(probe, runner, caplog, capsys):
    name = _folder("bom", probe)
    changed = runner.copy(probe, lambda data: BOM + data, name)
    out = runner.root / name / "out"
    command, outcome = runner.run(probe.command, out, caplog, capsys, probe, name)
    if probe.bom == "refused":
        assert outcome.status == 1 and len(outcome.errors) == 1, (probe.id, outcome.log[-3000:])
        assert f"{changed}: line 1: starts with a UTF-8 byte-order mark" in (
            outcome.errors[0].getMessage()
        ), probe.id
        assert "bug in fid" not in outcome.log, probe.id
        return
    assert outcome.status == 0, (probe.id, outcome.log[-3000:])
    expected = runner.reference(probe.command, caplog, capsys)
    assert command.result_of(out, outcome.printed) == expected, probe.id


# The inputs read line by line (json, csv and YAML parsers take either ending anyway).
CRLF_PROBES = [p for p in PROBES if p.id in {
    "convert-lists:dev_lists.jsonl", "convert-lists (FiD json, TSV):psgs.tsv",
    "build-passage-store:psgs.tsv", "retrieve-bm25:psgs.tsv", "retrieve:psgs.tsv",
    "embed-passages (shard 2 of 2):psgs.tsv", "prepare-questions (DPR qas TSV):qas.tsv",
    "prepare-questions:nq.jsonl", "eval-retrieval:dev.jsonl", "eval-retrieval:empty.yaml",
}]  # fmt: skip


@pytest.mark.parametrize("probe", CRLF_PROBES, ids=lambda p: p.id)
def test_crlf_line_endings_give_the_same_result(probe, runner, caplog, capsys):
    name = _folder("crlf", probe)
    runner.copy(probe, lambda data: data.replace(b"\n", b"\r\n"), name)
    out = runner.root / name / "out"
    command, outcome = runner.run(probe.command, out, caplog, capsys, probe, name)
    assert outcome.status == 0, (probe.id, outcome.log[-3000:])
    expected = runner.reference(probe.command, caplog, capsys)
    assert command.result_of(out, outcome.printed) == expected, probe.id


def test_the_reader_names_line_and_offset_of_the_first_bad_byte(tmp_path):
    """fid.text_files itself: the offset counts the BOM and CRLF bytes; UTF-16 gets a hint."""
    path = tmp_path / "f.txt"
    path.write_bytes(BOM + b"a\r\nb\xc3\r\nc\n")  # line 2 holds a cut 2-byte character
    lines = text_lines(path, "test lines")
    assert next(lines) == (1, "a\r\n")  # the BOM dropped, the line ending kept
    message = rf"{path}: line 2: not UTF-8 \(byte 0xc3 at byte offset 7: .*\): expected test lines"
    with pytest.raises(DataError, match=message):
        next(lines)
    with pytest.raises(DataError, match=message):
        read_text(path, "test lines")
    path.write_text("q\n", encoding="utf-16")
    with pytest.raises(DataError, match=r"line 1: not UTF-8 \(byte 0xff at byte offset 0.*UTF-16"):
        read_text(path, "test lines")


def test_jsonl_lines_end_at_newlines_only(tmp_path):
    """json.dumps(ensure_ascii=False), as fid writes jsonl, leaves U+2028, U+0085 and form
    feeds raw inside strings: a file fid wrote reads back (str.splitlines cut those lines)."""
    odd = "who\u2028wrote\x85it\x0cfirst?"
    raw = _jsonl(tmp_path / "raw.jsonl", [{"question": odd, "answer": ["x"]},
                                          {"question": "and then?", "answer": ["y"]}])  # fmt: skip
    assert _run("prepare-questions", "--input", raw, "--output", tmp_path / "q.jsonl") == 0
    assert "\u2028" in (tmp_path / "q.jsonl").read_text(encoding="utf-8")  # written raw
    assert [q["question"] for q in load_questions(tmp_path / "q.jsonl")] == [odd, "and then?"]


def test_metrics_read_back_on_resume(tmp_path, caplog):
    """A resumed run reads its metrics.jsonl back: the records after its checkpoint go, a last
    line torn by a kill is dropped with a warning, a bad byte or a bad line before the last is
    one error naming the file and line."""
    from fid.runtime.logs import MetricsWriter

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"kind": "train", "step": s, "loss": 1.0}) for s in (1, 2, 3)]
    path.write_text("\n".join(lines) + '\n{"kind": "train", "st')
    with caplog.at_level(logging.WARNING):
        MetricsWriter(path, None, resume_step=2).close()
    assert path.read_text() == "\n".join(lines[:2]) + "\n"
    assert "line 4 is not whole JSON" in caplog.text
    path.write_bytes(lines[0].encode() + b"\n\xff\n" + lines[1].encode() + b"\n")
    with pytest.raises(DataError, match=r"metrics.jsonl: line 2: not UTF-8 .*byte offset"):
        MetricsWriter(path, None, resume_step=2)
    path.write_text(lines[0] + "\nnot json\n" + lines[1] + "\n")
    with pytest.raises(DataError, match=r"metrics.jsonl: line 2: not JSON"):
        MetricsWriter(path, None, resume_step=2)
