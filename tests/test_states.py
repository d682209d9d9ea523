"""`--state-root`: fid finds a training run's state by what the run is (fid.training.states):
the same run resumes its state, another run gets a new one, and no state is ever deleted."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import write_json

from fid.cli import main
from fid.config import ReaderTrainConfig
from fid.training.states import STATE_RECORD, state_key, state_record

KNOBS = dict(
    n_passages=2, passage_max_tokens=16, batch_size_per_device=2, max_steps=2, warmup_steps=0,
    eval_every_steps=0, save_every_steps=1, log_every_steps=1, eval_batch_size=2,
    max_new_tokens=3, tensorboard=False,
)  # fmt: skip


@pytest.fixture
def run(tmp_path, tiny_model_dir, toy_records):
    train = write_json(tmp_path / "train.json", toy_records["train"][:4])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:2])

    def train_reader(knobs=None, train_file=train, output="model") -> int:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({**KNOBS, **(knobs or {})}))
        return main(["train-reader", "--config", str(config), "--train", str(train_file),
                     "--dev", str(dev), "--init-model", str(tiny_model_dir),
                     "--output", str(tmp_path / output), "--state-root",
                     str(tmp_path / "root")])  # fmt: skip

    return train_reader


def _states(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "root").iterdir())


def test_the_same_run_resumes_its_state(tmp_path, run, caplog):
    assert run() == 0
    (key,) = _states(tmp_path)
    state = tmp_path / "root" / key
    assert (state / "step-2").is_dir() and (state / "train.log").is_file()
    record = json.loads((state / STATE_RECORD).read_text())
    assert record["key"] == key and record["kind"] == "reader"
    assert record["config"]["lr"] == 1e-4 and "log_every_steps" not in record["config"]
    caplog.clear()
    # a cadence is no other run: the same state, resumed (the finished run exports again)
    assert run({"log_every_steps": 2}, output="model2") == 0
    assert _states(tmp_path) == [key] and "resumed from" in caplog.text
    # nor is a copy of the data elsewhere: content, not paths, identifies it
    moved = shutil.copy(tmp_path / "train.json", tmp_path / "moved.json")
    assert run(train_file=moved, output="model3") == 0 and _states(tmp_path) == [key]


def test_another_run_gets_a_new_state_and_the_old_one_is_kept(tmp_path, run, caplog):
    assert run() == 0
    (first,) = _states(tmp_path)
    caplog.clear()
    assert run({"lr": 3e-4}) == 0
    states = _states(tmp_path)
    assert len(states) == 2 and first in states
    assert "starting a new run" in caplog.text and "resumed from" not in caplog.text
    assert f"other training states under {tmp_path / 'root'}, kept" in caplog.text
    assert first in caplog.text
    other_data = write_json(
        tmp_path / "other.json", json.loads((tmp_path / "dev.json").read_text())
    )
    assert run(train_file=other_data) == 0 and len(_states(tmp_path)) == 3


def test_the_key_covers_refused_keys_only(tmp_path, tiny_model_dir):
    train = write_json(tmp_path / "t.json", [{"question": "q", "answers": ["a"],
                                             "ctxs": [{"title": "t", "text": "x"}]}])  # fmt: skip

    def key(**knobs):
        cfg = ReaderTrainConfig(**{**KNOBS, **knobs})
        return state_key(state_record("reader", cfg, {"train": train}, tiny_model_dir))

    assert key() == key(eval_every_steps=5, keep_last_checkpoints=4)  # cadences: same run
    assert key() != key(seed=1) != key(n_passages=3)
    assert key() != state_key(
        state_record("reader", ReaderTrainConfig(**KNOBS), {"train": train}, "t5-base")
    )


def test_state_dir_and_state_root_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train-reader", "--train", "t", "--dev", "d", "--init-model", "m", "--output",
              "o", "--state-dir", "s", "--state-root", "r"])  # fmt: skip
    assert "not allowed with argument" in capsys.readouterr().err
