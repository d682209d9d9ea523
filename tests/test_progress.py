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
    assert re.search(r"fid.retrieval.bm25: tokenize: [\d,]+ passages, [\d.,]+ passages/s", text), (
        text
    )
    assert re.search(r"fid.retrieval.bm25: fetch passages: \d+/\d+ rows \(100%\).*done", text), text
    assert re.search(
        r"fid.metrics.retrieval: has-answer: 200/200 questions \(100%\).*done", text
    ), text


def test_a_bad_interval_in_the_environment_names_the_variable(clock, monkeypatch):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "often")
    with pytest.raises(ValueError, match="FID_PROGRESS_INTERVAL_S='often': expected the seconds"):
        progress(desc="x", unit="items", log=log)
