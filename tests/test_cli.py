"""The `fid` command end to end: bad inputs, evaluation, scoring, checkpoint import, real text."""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import SAMPLES, write_json
from transformers import T5ForConditionalGeneration

from fid.cli import main

FAST_TRAIN = dict(
    n_passages=4,
    passage_max_tokens=32,
    batch_size_per_device=2,
    max_steps=3,
    warmup_steps=1,
    eval_every_steps=3,
    save_every_steps=3,
    log_every_steps=1,
    eval_batch_size=4,
    max_new_tokens=4,
    tensorboard=False,
)


def _yaml(path, data):
    path.write_text(yaml.safe_dump(data))
    return path


def _train_args(tmp_path, model_dir, train, dev, config):
    return [
        "train-reader",
        "--config",
        str(config),
        "--train",
        str(train),
        "--dev",
        str(dev),
        "--init-model",
        str(model_dir),
        "--output",
        str(tmp_path / "out" / "model"),
        "--state-dir",
        str(tmp_path / "out" / "state"),
    ]


@pytest.fixture
def files(tmp_path, toy_records):
    return {
        "train": write_json(tmp_path / "train.json", toy_records["train"][:8]),
        "dev": write_json(tmp_path / "dev.json", toy_records["dev"][:4]),
        "config": _yaml(tmp_path / "train.yaml", FAST_TRAIN),
    }


BAD_QUESTIONS = {
    "malformed JSON": ('[{"question": "a"', "invalid JSON at line 1"),
    "no question": (
        json.dumps([{"answers": ["x"], "ctxs": [{"title": "", "text": "x"}]}]),
        "field 'question'",
    ),
    "answers not a list": (
        json.dumps([{"question": "q", "answers": "x", "ctxs": [{"title": "", "text": "x"}]}]),
        "field 'answers' must be a list",
    ),
    "ctxs missing": (
        json.dumps([{"question": "q", "answers": ["x"]}]),
        "field 'ctxs' must be a non-empty list",
    ),
    "ctxs empty": (
        json.dumps([{"question": "q", "answers": ["x"], "ctxs": []}]),
        "field 'ctxs' must be a non-empty list",
    ),
}


def test_in_process_training_run_gives_the_signal_handlers_back(tmp_path, files, tiny_model_dir):
    """`main` records SIGUSR1/SIGTERM during a training run and then restores the caller's
    handlers; only the `fid` process (`command`) ignores them after the run."""
    before = {number: signal.getsignal(number) for number in (signal.SIGUSR1, signal.SIGTERM)}
    missing = tmp_path / "missing.json"
    assert main(_train_args(tmp_path, tiny_model_dir, missing, files["dev"], files["config"])) == 1
    assert {number: signal.getsignal(number) for number in before} == before


@pytest.mark.parametrize("case", sorted(BAD_QUESTIONS))
def test_bad_training_data_fails_cleanly(case, tmp_path, files, tiny_model_dir, caplog):
    content, message = BAD_QUESTIONS[case]
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(_train_args(tmp_path, tiny_model_dir, bad, files["dev"], files["config"])) == 1
    assert message in caplog.text and str(bad) in caplog.text
    assert not (tmp_path / "out" / "model").exists()
    assert not list((tmp_path / "out" / "state").glob("step-*"))


@pytest.mark.parametrize(
    "config, message",
    [
        ({"n_passages": 4, "n_pasages": 2}, "unknown key 'n_pasages'"),
        ({"n_passages": -1}, "n_passages = -1 is out of range: expected >= 1"),
    ],
)
def test_bad_config_fails_cleanly(config, message, tmp_path, files, tiny_model_dir, caplog):
    path = _yaml(tmp_path / "bad.yaml", config)
    assert main(_train_args(tmp_path, tiny_model_dir, files["train"], files["dev"], path)) == 1
    assert message in caplog.text and str(path) in caplog.text
    # Only the run log (which records the error) and the state's lock file are written; no
    # model, no checkpoint.
    written = sorted(p.name for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert written == ["run.lock", "train.log"]


def test_missing_files_fail_cleanly(tmp_path, files, tiny_model_dir, caplog):
    missing = tmp_path / "nope.json"
    assert main(_train_args(tmp_path, tiny_model_dir, missing, files["dev"], files["config"])) == 1
    assert f"{missing}: file not found" in caplog.text
    args = _train_args(tmp_path, tiny_model_dir, files["train"], files["dev"], tmp_path / "x.yaml")
    assert main(args) == 1 and "config file not found" in caplog.text
    code = main(
        ["eval-reader", "--model", str(tmp_path / "no-model"), "--questions", str(files["dev"]),
         "--predictions", str(tmp_path / "p.jsonl"), "--metrics", str(tmp_path / "m.json")]
    )  # fmt: skip
    assert code == 1 and not (tmp_path / "p.jsonl").exists()


def test_exit_status_of_the_installed_command(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_passages: -2\n")
    result = subprocess.run(
        [sys.executable, "-m", "fid", "score-passages", "--config", str(bad), "--model", "m",
         "--questions", "q.json", "--output", str(tmp_path / "o.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 1
    assert "n_passages = -2 is out of range" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "o.json").exists()


def test_job_logs_carry_no_progress_bars(tmp_path, files, tiny_model_dir):
    """transformers draws a "Loading weights" bar per model load and rank into the job logs."""
    result = subprocess.run(
        [sys.executable, "-m", "fid", "--threads", "1", "score-passages", "--model",
         str(tiny_model_dir), "--questions", str(files["dev"]), "--output",
         str(tmp_path / "o.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "INFO" in result.stderr and "Loading weights" not in result.stderr


def test_train_eval_score(tmp_path, files, tiny_model_dir, toy_records):
    assert (
        main(_train_args(tmp_path, tiny_model_dir, files["train"], files["dev"], files["config"]))
        == 0
    )
    model = tmp_path / "out" / "model"

    # Questions without answers: predictions only, no metric, no crash.
    unlabeled = [dict(r, answers=[]) for r in toy_records["test"][:3]]
    questions = write_json(tmp_path / "unlabeled.json", unlabeled)
    eval_config = _yaml(
        tmp_path / "eval.yaml", {"n_passages": 4, "num_beams": 2, "max_new_tokens": 3}
    )
    code = main(
        ["eval-reader", "--config", str(eval_config), "--model", str(model), "--questions",
         str(questions), "--predictions", str(tmp_path / "p.jsonl"), "--metrics", str(tmp_path / "m.json")]
    )  # fmt: skip
    assert code == 0
    predictions = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [p["id"] for p in predictions] == [r["id"] for r in unlabeled]
    assert all("exact_match" not in p for p in predictions)
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["exact_match"] is None and metrics["n_unlabeled"] == 3

    # Passage pruning and token elimination reach eval-reader from its config; keeping every
    # passage and token gives the plain predictions.
    dev = write_json(tmp_path / "dev4.json", toy_records["dev"][:4])
    predictions = {}
    for name, extra in [("plain", {}), ("fast", {"keep_passages": 4, "keep_tokens": 100})]:
        config = _yaml(tmp_path / f"{name}.yaml", {"n_passages": 4, "max_new_tokens": 3, **extra})
        code = main(
            ["eval-reader", "--config", str(config), "--model", str(model), "--questions", str(dev),
             "--predictions", str(tmp_path / f"{name}.jsonl"), "--metrics", str(tmp_path / f"{name}.m.json")]
        )  # fmt: skip
        assert code == 0
        lines = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        predictions[name] = [json.loads(line)["prediction"] for line in lines]
    assert predictions["fast"] == predictions["plain"]

    # Scores go into every ctx the reader read (top 4 by score); the others get None.
    records = toy_records["dev"][:4]
    records[0] = dict(records[0], ctxs=[dict(c, reader_score=123.0) for c in records[0]["ctxs"]])
    questions = write_json(tmp_path / "dev_stale.json", records)
    score_config = _yaml(tmp_path / "score.yaml", {"n_passages": 4, "mode": "attention_mass"})
    code = main(
        ["score-passages", "--config", str(score_config), "--model", str(model),
         "--questions", str(questions), "--output", str(tmp_path / "scored.json")]
    )  # fmt: skip
    assert code == 0
    scored = json.loads((tmp_path / "scored.json").read_text())
    for record, original in zip(scored, records, strict=True):
        assert record["reader_scoring"] == {
            "mode": "attention_mass",
            "n_passages": 4,
            "n_scored": 4,
        }
        top = sorted(range(len(original["ctxs"])), key=lambda i: -original["ctxs"][i]["score"])[:4]
        for i, ctx in enumerate(record["ctxs"]):
            assert (ctx["reader_score"] is not None) == (i in top)
            assert ctx["score"] == original["ctxs"][i]["score"]  # retriever scores kept
        assert sum(ctx["reader_score"] or 0 for ctx in record["ctxs"]) == pytest.approx(1, abs=1e-3)


def test_convert_released_checkpoint(tmp_path, tiny_t5, tokenizer, caplog):
    """A state dict in the released FiD layout imports into plain T5 with the same outputs."""
    released = {}
    for key, value in tiny_t5.state_dict().items():
        if key.startswith("encoder."):
            key = "encoder." + re.sub(r"^encoder\.block\.(\d+)\.", r"encoder.block.\1.module.", key)
        released[key] = value.clone()
    released.pop("decoder.embed_tokens.weight")  # tied: not always saved
    released["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = (
        torch.randn(32, 4)
    )
    assert "encoder.encoder.block.1.module.layer.0.SelfAttention.q.weight" in released
    folder = tmp_path / "released"
    folder.mkdir()
    torch.save(released, folder / "pytorch_model.bin")
    tiny_t5.config.to_json_file(folder / "config.json")

    code = main(
        ["convert-checkpoint", "--checkpoint", str(folder), "--output", str(tmp_path / "hf")]
    )
    assert code == 0 and "relative_attention_bias" in caplog.text
    converted = T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(3, 300, (2, 7))
    labels = torch.randint(3, 300, (2, 3))
    with torch.no_grad():
        torch.testing.assert_close(
            converted(input_ids=ids, labels=labels).logits,
            tiny_t5.eval()(input_ids=ids, labels=labels).logits,
        )

    bad = {k.replace("encoder.encoder.", "encoder."): v for k, v in released.items()}
    torch.save(bad, folder / "pytorch_model.bin")
    code = main(
        ["convert-checkpoint", "--checkpoint", str(folder), "--output", str(tmp_path / "hf2")]
    )
    assert code == 1 and "released FiD encoder keys start with" in caplog.text
    assert not (tmp_path / "hf2").exists()


def _squad_questions(n_passages=5, limit=24):
    """FiD-format questions from the real squad-open-tiny set; ctxs ranked by word overlap
    (a stand-in for a retriever, enough for a real-text run of the reader)."""
    with open(SAMPLES / "squad-open-tiny" / "psgs_w100.tsv", newline="") as handle:
        passages = list(csv.DictReader(handle, delimiter="\t"))
    lines = (SAMPLES / "squad-open-tiny" / "questions.jsonl").read_text().splitlines()
    records = []
    for i, line in enumerate(lines[:limit]):
        question = json.loads(line)
        words = set(question["question"].lower().split())
        ranked = sorted(passages, key=lambda p: -len(words & set(p["text"].lower().split())))
        ctxs = [
            {"id": p["id"], "title": p["title"], "text": p["text"], "score": float(n_passages - k)}
            for k, p in enumerate(ranked[:n_passages])
        ]
        records.append({"id": f"squad-{i}", "question": question["question"],
                        "answers": question["answer"], "ctxs": ctxs})  # fmt: skip
    return records


def test_real_text_run(tmp_path):
    records = _squad_questions()
    train = write_json(tmp_path / "train.json", records[:16])
    dev = write_json(tmp_path / "dev.json", records[16:])
    passages = SAMPLES / "squad-open-tiny" / "psgs_w100.tsv"
    init = _yaml(tmp_path / "init.yaml", {"vocab_size": 2000, "d_model": 32, "d_ff": 64, "d_kv": 8,
                                            "num_heads": 4})  # fmt: skip
    assert main(["init-reader", "--config", str(init), "--corpus", str(passages), str(train),
                 "--output", str(tmp_path / "init")]) == 0  # fmt: skip
    config = _yaml(tmp_path / "train.yaml", dict(FAST_TRAIN, n_passages=5, passage_max_tokens=200))
    assert main(_train_args(tmp_path, tmp_path / "init", train, dev, config)) == 0
    model = tmp_path / "out" / "model"
    assert main(["eval-reader", "--model", str(model), "--questions", str(dev), "--predictions",
                 str(tmp_path / "p.jsonl"), "--metrics", str(tmp_path / "m.json")]) == 0  # fmt: skip
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["n_scored"] == 8 and 0 <= metrics["exact_match"] <= 100
    assert main(["score-passages", "--model", str(model), "--questions", str(dev),
                 "--output", str(tmp_path / "s.json")]) == 0  # fmt: skip
    scored = json.loads((tmp_path / "s.json").read_text())
    assert all(isinstance(c["reader_score"], float) for r in scored for c in r["ctxs"])


def test_cpu_only_commands_take_no_device(tmp_path, monkeypatch):
    """build-index (faiss on the CPU), init-reader, init-retriever and convert-checkpoint run
    torch on the CPU only: on a GPU node they set up a device, a CUDA context on a GPU that
    another job may be using (issue 43.7). Their threads still follow --threads, faiss's too."""
    import faiss
    import numpy as np

    from fid.cli.parser import DEVICE_FREE, build_parser
    from fid.retrieval.embeddings import save_embedding_shard
    from fid.runtime import distributed

    def no_device(*args, **kwargs):
        raise AssertionError("a CPU-only command set up a device")

    monkeypatch.setattr(distributed, "setup", no_device)
    vectors = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    save_embedding_shard(tmp_path / "shard0", vectors, [f"p{i}" for i in range(64)], 0, 1, "m")
    faiss.omp_set_num_threads(2)
    threads = torch.get_num_threads()
    try:
        assert main(["--threads", "1", "build-index", "--shards", str(tmp_path / "shard0"),
                     "--output", str(tmp_path / "index")]) == 0  # fmt: skip
        assert faiss.omp_get_max_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "index").is_dir()
    parser = build_parser()
    commands = [a for a in parser._actions if a.dest == "command"][0].choices
    assert set(commands) >= DEVICE_FREE
    for name, sub in commands.items():
        assert sub.get_default("takes_device") == (
            sub.get_default("runs_models") and name not in DEVICE_FREE
        ), name
    assert commands["train-reader"].get_default("takes_device")
