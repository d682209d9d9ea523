"""Progress of long loops in logs (stderr not a terminal): bounded lines with count, rate and ETA;
tqdm's bar on a terminal; and progress lines in a real command's log."""

from __future__ import annotations

import io
import logging
import re

import pytest
from conftest import SAMPLES

from fid.cli import main
from fid.runtime.progress import PROGRESS_INTERVAL_ENV, progress

SQUAD = SAMPLES / "squad-open-tiny"
log = logging.getLogger("fid.test_progress")


class _Clock:
    """A fake clock for tqdm: advanced by hand, so the test needs no sleeping."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr("tqdm.std.time", clock)
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal
    return clock


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == log.name]


def test_lines_are_bounded_and_carry_count_rate_and_eta(clock, caplog):
    caplog.set_level(logging.INFO)
    # 100 items, 1 s each, a line at most every 10 s: 10 lines (none at the start).
    for _ in progress(range(100), desc="embed", unit="passages", log=log, interval_s=10):
        clock.now += 1.0
    lines = _lines(caplog)
    assert len(lines) == 10, lines
    assert lines[0] == "embed: 10/100 passages (10%), 1 passages/s, elapsed 00:10, ETA 01:30"
    assert lines[-1] == "embed: 100/100 passages (100%), 1 passages/s, elapsed 01:40, done"


def test_interval_from_the_environment_and_a_final_line(clock, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "25")
    with progress(desc="search", unit="questions", total=50, log=log) as bar:
        for _ in range(10):
            clock.now += 3.0
            bar.update(5)  # 50 questions in 30 s: a line at 27 s (the first after 25 s)
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert re.fullmatch(r"search: 45/50 questions \(90%\), [\d.]+ questions/s, "
                        r"elapsed 00:27, ETA 00:0\d", lines[0]), lines  # fmt: skip
    assert lines[1] == "search: 50/50 questions (100%), 1.67 questions/s, elapsed 00:30, done"


def test_unknown_total_logs_count_and_rate(clock, caplog):
    caplog.set_level(logging.INFO)
    with progress(desc="tokenize", unit="passages", log=log, interval_s=60) as bar:
        for _ in range(3):
            clock.now += 1.0
            bar.update(1000)
    assert _lines(caplog) == ["tokenize: 3,000 passages, 1,000 passages/s, elapsed 00:03"]


def test_silent_when_the_logger_is_off(clock, caplog):
    caplog.set_level(logging.WARNING)  # ranks other than 0
    for _ in progress(range(5), desc="x", unit="items", log=log, interval_s=0):
        clock.now += 1.0
    assert _lines(caplog) == []


def test_a_terminal_gets_tqdms_bar_and_no_log_lines(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    terminal = io.StringIO()
    terminal.isatty = lambda: True
    monkeypatch.setattr("sys.stderr", terminal)
    for _ in progress(range(5), desc="embed", unit="passages", log=log, interval_s=0):
        pass
    assert _lines(caplog) == []
    assert "5/5" in terminal.getvalue() and "|" in terminal.getvalue()  # the bar


def test_retrieve_bm25_and_eval_retrieval_log_progress(tmp_path, monkeypatch):
    """The workflow's case: logs go to a file (stderr is not a terminal under pytest)."""
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "0")
    (tmp_path / "bm25.yaml").write_text("top_k: 5\nbatch_size: 50\n")
    (tmp_path / "eval.yaml").write_text("ks: [1, 5]\nrecompute_has_answer: true\n")
    logfile = tmp_path / "fid.log"
    run = [str(a) for a in ("--log-file", logfile)]
    passages = SQUAD / "psgs_w100.tsv"
    assert main([*run, "build-bm25", "--passages", str(passages), "--output",
                 str(tmp_path / "index")]) == 0  # fmt: skip
    assert main([*run, "retrieve-bm25", "--config", str(tmp_path / "bm25.yaml"), "--index",
                 str(tmp_path / "index"), "--passages", str(passages), "--questions",
                 str(SQUAD / "questions.jsonl"), "--output", str(tmp_path / "r.json")]) == 0  # fmt: skip
    assert main([*run, "eval-retrieval", "--config", str(tmp_path / "eval.yaml"),
                 "--questions", str(tmp_path / "r.json"), "--output",
                 str(tmp_path / "m.json")]) == 0  # fmt: skip
    text = logfile.read_text()
    search = re.findall(r"BM25 search: (\d+)/200 questions \(\d+%\), [\d.,]+ questions/s, "
                        r"elapsed \d\d:\d\d, (?:ETA \d\d:\d\d|done)", text)  # fmt: skip
    assert search == ["50", "100", "150", "200"], text
    assert re.search(r"fid.retrieval.bm25: tokenize: 167/167 passages \(100%\), .*done", text), text
    for k in (1, 2, 3):  # bm25s's builder reads the documents three times
        assert re.search(rf"BM25 index, pass {k} of 3: 167/167 passages \(100%\).*done", text)
    assert re.search(r"fid.retrieval.bm25: fetch passages: \d+/\d+ rows \(100%\).*done", text), text
    assert re.search(
        r"fid.metrics.retrieval: has-answer: 200/200 questions \(100%\).*done", text
    ), text


def test_a_bad_interval_in_the_environment_names_the_variable(clock, monkeypatch):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "often")
    with pytest.raises(ValueError, match="FID_PROGRESS_INTERVAL_S='often': expected the seconds"):
        progress(desc="x", unit="items", log=log)


def _run_on_a_terminal(command: list[str], env: dict) -> tuple[int, str]:
    """Runs `command` with stdout and stderr on a pseudo-terminal (Snakemake started at a
    terminal: its jobs inherit it); its exit status and what the terminal showed."""
    import os
    import pty
    import subprocess

    master, slave = pty.openpty()
    process = subprocess.Popen(command, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's last holder is gone
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return process.wait(), shown.decode().replace("\r\n", "\n")


def test_a_workflow_jobs_console_shows_its_progress_results_and_warnings(
    tmp_path, tiny_model_dir, toy_records
):
    """`fid --log-file LOG` (every workflow rule): the console, shared with Snakemake and other
    jobs, gets lines (never a bar, even on a terminal) naming the job, with steps, ETA and loss
    at most every FID_PROGRESS_INTERVAL_S seconds, and the dev result; the log file gets every
    record."""
    import json
    import os
    import sys

    import yaml

    train, dev = tmp_path / "train.json", tmp_path / "dev.json"
    train.write_text(json.dumps(toy_records["train"][:16]))
    dev.write_text(json.dumps(toy_records["dev"][:4]))
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(dict(
        n_passages=2, passage_max_tokens=24, batch_size_per_device=2, max_steps=40,
        warmup_steps=1, eval_every_steps=40, save_every_steps=20, log_every_steps=5,
        eval_batch_size=4, max_new_tokens=3, tensorboard=False)))  # fmt: skip
    log_file = tmp_path / "logs" / "train.log"
    env = {**os.environ, PROGRESS_INTERVAL_ENV: "0.05"}
    status, shown = _run_on_a_terminal(
        [sys.executable, "-m", "fid", "--threads", "1", "--log-file", str(log_file),
         "train-reader", "--config", str(config), "--train", str(train), "--dev", str(dev),
         "--init-model", str(tiny_model_dir), "--output", str(tmp_path / "model"),
         "--state-dir", str(tmp_path / "state")], env,
    )  # fmt: skip
    assert status == 0, shown[-3000:]
    lines = [line for line in shown.splitlines() if line.strip()]
    job = f"train-reader ({log_file})"
    assert lines and all(re.match(rf"\d\d:\d\d:\d\d {re.escape(job)}: ", line) for line in lines), (
        shown
    )
    steps = [line for line in lines if re.search(r": train: \d+/40 steps \(\d+%\), ", line)]
    assert len(steps) >= 2, shown
    assert "ETA" in steps[0] and re.search(r"loss=\d+\.\d{3}$", steps[-1]), steps
    assert steps[-1].split(": train: ")[1].startswith("40/40 steps (100%)")
    assert any(re.search(r": step 40 dev exact_match [\d.]+%$", line) for line in lines)
    assert "\r" not in shown and "|" not in shown  # lines, not a tqdm bar
    assert "saved checkpoint" not in shown and "INFO" not in shown
    text = log_file.read_text()
    assert "INFO fid.training.checkpoint: saved checkpoint" in text
    assert re.search(r"INFO fid.training.loop: train: 40/40 steps \(100%\)", text)


def test_bytes_are_shown_as_sizes(clock, caplog):
    caplog.set_level(logging.INFO)
    with progress(desc="download psgs_w100.tsv.gz", unit="B", total=4_700_000_000, log=log,
                  initial=1_000_000_000, interval_s=10) as bar:  # fmt: skip
        clock.now += 20.0
        bar.update(500_000_000)
    assert _lines(caplog)[0] == (
        "download psgs_w100.tsv.gz: 1.5 GB/4.7 GB (32%), 25.0 MB/s, elapsed 00:20, ETA 02:08"
    )


def test_download_checksum_and_extraction_show_progress_on_the_console(tmp_path, monkeypatch):
    """A workflow job's console (`--log-file`) gets byte counts, rate and ETA for a download
    (also when it resumes), its checksum and an extraction: not silence until "Finished"."""
    import gzip
    import os
    import sys

    payload = os.urandom(3_000_000)
    source = tmp_path / "psgs.tsv.gz"
    source.write_bytes(gzip.compress(payload, compresslevel=1))
    env = {**os.environ, PROGRESS_INTERVAL_ENV: "0"}
    log_file = tmp_path / "logs" / "download.log"
    part = tmp_path / "psgs.tsv.gz.part"
    status, shown = _run_on_a_terminal(
        [sys.executable, "-m", "fid", "--log-file", str(log_file), "download", "--settings",
         "chunk_bytes: 65536", "--url", source.as_uri(), "--output", str(tmp_path / "g.gz")],
        env,
    )  # fmt: skip
    assert status == 0, shown[-3000:]
    size = source.stat().st_size
    assert re.search(rf"download psgs.tsv.gz: [\d.]+ [kM]B/{size / 1e6:.1f} MB \(\d+%\), "
                     r"[\d.]+ [kMG]B/s, elapsed", shown), shown  # fmt: skip
    assert re.search(r"checksum g.gz.part: .* \(100%\).*done", shown), shown
    assert not part.exists()
    extracted = tmp_path / "p.tsv"
    status, shown = _run_on_a_terminal(
        [sys.executable, "-m", "fid", "--log-file", str(log_file), "extract", "--archive",
         str(tmp_path / "g.gz"), "--output", str(extracted)], env,
    )  # fmt: skip
    assert status == 0 and extracted.read_bytes() == payload, shown[-3000:]
    assert re.search(r"extract g.gz: .*\(100%\).*done", shown), shown
