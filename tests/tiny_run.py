"""A finished run folder, tiny and built in seconds, laid out as the workflow writes it (no
snakemake): what `fid ask` and `fid serve` answer with (tests/test_ask.py, tests/test_serve.py,
tests/test_serve_browser.py)."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fid.cli import main
from fid.config import InitRetrieverConfig
from fid.demo.files import write_world
from fid.demo.tiny_models import build_tiny_bert, train_bert_tokenizer
from fid.models.retriever import DualEncoder, DualEncoderSpec
from fid.models.settings import ReaderSettings

N_PASSAGES = 3  # the run's eval_reader.yaml


def write_tiny_run(root: Path, tiny_model_dir: Path, toy_world) -> Path:
    """root/results/demo of a 2-round run: round 0's reader, retriever and index, round 1's
    reader (its system: it read round 0's lists) and round 1's retriever, whose index is round
    0's (a decoy: asked with it, the index refuses the encoder), passages, stage configs."""
    run = root / "results" / "demo"
    write_world(toy_world, run / "data/demo/world")
    for i in (0, 1):
        shutil.copytree(tiny_model_dir, run / f"iter{i}/reader/model")
        ReaderSettings(passage_max_tokens=48, n_passages=5).save(run / f"iter{i}/reader/model")
    tokenizer = train_bert_tokenizer([p.text for p in toy_world.passages], vocab_size=300)
    config = InitRetrieverConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    spec = DualEncoderSpec(input_format="fid", question_max_tokens=16, passage_max_tokens=48)
    DualEncoder(build_tiny_bert(config, len(tokenizer)), None, spec).save_pretrained(
        run / "iter0/retriever/model", tokenizer=tokenizer
    )
    shard = run / "iter0/embeddings/shard0"
    assert main(["embed-passages", "--model", str(run / "iter0/retriever/model"),
                 "--passages", str(run / "data/demo/world/passages.tsv"),
                 "--output", str(shard)]) == 0  # fmt: skip
    assert main(["build-index", "--shards", str(shard), "--output", str(run / "iter0/index")]) == 0
    shutil.copytree(run / "iter0/retriever/model", run / "iter1/retriever/model")
    other_weights(run / "iter1/retriever/model")
    shutil.copytree(run / "iter0/index", run / "iter1/index")
    (run / "config").mkdir()
    (run / "config/eval_reader.yaml").write_text(f"n_passages: {N_PASSAGES}\nmax_new_tokens: 6\n")
    (run / "config/retrieve.yaml").write_text("top_k: 20\n")
    return run


def assert_asks_as_listed(run: Path, lists: Path, questions: list[str], capsys, rel: float) -> None:
    """`fid ask --run RUN --round 0 --json` on each question reads the first N_PASSAGES
    passages of its record in `lists` (a retrieval file the run wrote), in that order, with
    those scores (to `rel`)."""
    listed = json.loads(lists.read_text())
    for question in questions:
        assert main(["ask", "--run", str(run), "--round", "0", "--json", question]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == len(listed) == len(questions)
    for record, entry in zip(records, listed, strict=True):
        assert record["question"] == entry["question"]
        top = entry["ctxs"][:N_PASSAGES]
        assert [p["id"] for p in record["passages"]] == [c["id"] for c in top]
        assert [p["score"] for p in record["passages"]] == pytest.approx(
            [c["score"] for c in top], rel=rel
        )


def other_weights(retriever: Path) -> None:
    """The retriever's folder with its encoder's weights drawn again (same shapes)."""
    from safetensors.torch import load_file, save_file

    weights = retriever / "question_encoder" / "model.safetensors"
    tensors = load_file(weights)
    save_file({name: torch.randn_like(t) if t.is_floating_point() else t
               for name, t in tensors.items()}, str(weights))  # fmt: skip


def load_system(run: Path):
    """The run's system (`fid ask --run`'s), loaded on the CPU: an AskSystem."""
    from fid.evaluation.ask import AskSystem
    from fid.evaluation.run_folder import run_paths

    paths = run_paths(run, None, reader=None, retriever=None, index=None, passages=None)
    return AskSystem(paths, None, None, torch.device("cpu"))


@contextlib.contextmanager
def serving(system) -> Iterator:
    """`fid serve`'s server for `system` on 127.0.0.1 and a free port, in a thread of this
    process, for the block."""
    from fid.serving.server import make_server

    server = make_server(system)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
