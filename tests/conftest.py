"""Shared fixtures: tiny models built on the spot (no downloads), toy FiD data, seeding."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest
import torch

from fid.config import InitReaderConfig, WorldConfig
from fid.demo.files import reader_examples
from fid.demo.tiny_models import build_tiny_t5, train_tokenizer
from fid.demo.world import build_world
from fid.models.reader import FiDReader

SAMPLES = Path(__file__).resolve().parents[1] / "samples"

# Tiny sizes used across the tests: fast on one CPU thread.
TINY = dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4)


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    random.seed(0)
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def toy_world():
    return build_world(WorldConfig(seed=0, n_entities=12, n_dev_facts=8, n_test_facts=8))


@pytest.fixture(scope="session")
def toy_records(toy_world):
    """FiD-format records: {split: [record]} with 6 passages per question."""
    return {split: reader_examples(toy_world, split, 6, seed=0) for split in toy_world.splits}


@pytest.fixture(scope="session")
def tokenizer(toy_world):
    texts = [p.text for p in toy_world.passages] + [p.title for p in toy_world.passages]
    texts += [q.question for qs in toy_world.splits.values() for q in qs]
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture
def tiny_t5(tokenizer):
    return build_tiny_t5(InitReaderConfig(vocab_size=400, **TINY), vocab_size=len(tokenizer))


@pytest.fixture
def tiny_reader(tiny_t5):
    return FiDReader(tiny_t5, encoder_buckets=3).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A saved tiny T5 + tokenizer folder, as `fid init-reader` writes it."""
    path = tmp_path_factory.mktemp("tiny_model")
    torch.manual_seed(0)
    t5 = build_tiny_t5(InitReaderConfig(vocab_size=400, **TINY), vocab_size=len(tokenizer))
    t5.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def scored_retriever_inputs(
    root: Path, records: dict, n_train: int, n_dev: int, n_ctxs: int
) -> tuple[Path, Path, Path]:
    """(train.json, dev.json, a tiny BERT folder) for `fid train-retriever` under `root`: the
    first toy questions, each with its first `n_ctxs` passages scored by their rank (the
    teacher's `reader_score`), and a BERT whose tokenizer learned their texts."""
    from fid.config import InitRetrieverConfig
    from fid.demo.tiny_models import build_tiny_bert, train_bert_tokenizer

    scored = []
    for record in records["train"][:n_train] + records["dev"][:n_dev]:
        ctxs = [dict(c, reader_score=float(i)) for i, c in enumerate(record["ctxs"][:n_ctxs])]
        scored.append(dict(record, ctxs=ctxs))
    train = write_json(root / "train.json", scored[:n_train])
    dev = write_json(root / "dev.json", scored[n_train:])
    texts = [c["text"] for r in scored for c in r["ctxs"]] + [r["question"] for r in scored]
    tokenizer = train_bert_tokenizer(texts, 300)
    bert = InitRetrieverConfig(hidden_size=32, num_heads=4, intermediate_size=64)
    build_tiny_bert(bert, len(tokenizer)).save_pretrained(root / "bert")
    tokenizer.save_pretrained(root / "bert")
    return train, dev, root / "bert"


def assert_same_weights(expected: Path, got: Path) -> None:
    """Two exported models (their model.safetensors) hold bitwise equal tensors."""
    import torch
    from safetensors.torch import load_file

    want, have = load_file(expected), load_file(got)
    assert want.keys() == have.keys()
    for name in want:
        assert torch.equal(want[name], have[name]), name


def pytest_configure(config):
    """Ctrl-C reaches the processes the tests start, however the suite was started.

    A non-interactive shell starts a background job (`.ci/run &`, `nohup make test &`) with
    SIGINT ignored, and an ignored signal stays ignored in every child: `fid serve` and
    snakemake would never see the Ctrl-C that tests/test_serve.py and tests/slurm/test_slurm.py
    send them as a terminal would (a terminal's Ctrl-C is never ignored). With a handler here
    instead, each child starts with SIGINT's default action, and Python's own handler."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """The longest test files first, so that make test's `pytest -n 2 --dist loadfile
    --no-loadscope-reorder` starts them at once, one per worker (xdist then hands out files in
    this order, each file to one worker): the demo end to end (~20 min on 2 cores), the SLURM
    tests (~10 min; one file: one cluster), the scale rehearsal (~8 min). xdist hands each
    worker two files at the start (worker 0 the 1st and 3rd, worker 1 the 2nd and 4th): a
    short file third keeps the scale rehearsal off the demo's worker (it made the critical
    path ~34 min when it ran after the demo)."""
    first = {"test_end_to_end.py": 0, "test_slurm.py": 1, "test_metrics.py": 2,
             "test_scale_rehearsal.py": 3, "test_rebuild.py": 4, "test_gpu_check.py": 5}  # fmt: skip
    items.sort(key=lambda item: first.get(Path(item.path).name, 9))


def pytest_sessionfinish(session, exitstatus):
    """With FID_FORBID_SKIPS=1 (.ci/run) a skipped test fails the run: CI must prove every test,
    and a skip for a missing sample, tool or service would hide what a user's clone lacks."""
    if os.environ.get("FID_FORBID_SKIPS") != "1" or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        names = ", ".join(report.nodeid for report in skipped[:10])
        reporter.ensure_newline()
        reporter.write_line(f"FID_FORBID_SKIPS=1: {len(skipped)} skipped test(s) fail CI: {names}")
        session.exitstatus = 1


@pytest.fixture(scope="session")
def tiny_retriever_dir(tmp_path_factory, toy_world):
    """A saved tiny DualEncoder (BERT, shared, projected) with its tokenizer."""
    from fid.config import InitRetrieverConfig
    from fid.demo.tiny_models import build_tiny_bert, train_bert_tokenizer
    from fid.models.retriever import DualEncoder, DualEncoderSpec

    path = tmp_path_factory.mktemp("tiny_retriever")
    tokenizer = train_bert_tokenizer([p.text for p in toy_world.passages], vocab_size=300)
    config = InitRetrieverConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    encoder = build_tiny_bert(config, vocab_size=len(tokenizer))
    model = DualEncoder(encoder, None, DualEncoderSpec(projection_dim=8))
    model.save_pretrained(path, tokenizer=tokenizer)
    return path
