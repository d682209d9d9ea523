"""No command replaces what it did not write: every subcommand walked with every collision.

The guard (fid.runtime.output_guard) runs in `fid.cli` before any work, so the walk replaces
each command's handler by a recorder that writes the declared outputs: a refused call never
reaches it, an allowed one does. Cases per command and output flag: the output is an input
file, a folder above one, inside an input folder, the training state (or around it), another
output of the call, an existing file fid did not write (refused; `--replace` allows it), fid's
own earlier output (allowed) and that output changed since (refused). Then the real commands:
a run folder that build-index would have wiped, a corpus that build-passage-store would have
turned into a folder, questions that eval-reader would have overwritten.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import write_json

from fid.cli import main
from fid.cli.parser import build_parser
from fid.runtime.output_guard import MARKER_SUFFIX

NO_OUTPUTS = {"ask", "serve", "plan-memory", "plan-disk"}  # they print, write nothing


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


SUBCOMMANDS = _subparsers()
WITH_OUTPUTS = sorted(name for name in SUBCOMMANDS if name not in NO_OUTPUTS)


def _outputs_of(name: str) -> dict[str, tuple[str, ...]]:
    return SUBCOMMANDS[name]._defaults["outputs"]


def _handler(name: str) -> tuple[object, str]:
    """(the module that defines a subcommand's handler, the handler's name)."""
    func = SUBCOMMANDS[name]._defaults["func"]
    return sys.modules[func.__module__], func.__name__


class Call:
    """One subcommand's argv, built from its parser: every input flag names its own file
    under `tmp/inputs`, every output its own path under `tmp/out`."""

    def __init__(self, name: str, tmp: Path):
        self.name, self.tmp = name, tmp
        self.outputs = _outputs_of(name)
        self.values: dict[str, list[str]] = {}
        self.inputs: dict[str, Path] = {}
        (tmp / "inputs").mkdir(exist_ok=True)
        for action in SUBCOMMANDS[name]._actions:
            if not action.option_strings or action.dest in ("help", "replace"):
                continue
            flag = action.option_strings[0]
            dest = action.dest
            if dest in self.outputs:
                self.values[flag] = [str(tmp / "out" / dest)]
            elif dest == "state_root" or (dest == "state_dir" and not action.required):
                continue  # a training command gets --state-dir below
            elif action.required or dest in ("config",):
                if action.choices:
                    self.values[flag] = [sorted(action.choices)[0]]
                elif dest == "url":
                    source = tmp / "inputs" / "url" / "url.json"
                    source.parent.mkdir(parents=True, exist_ok=True)
                    source.write_text("data\n")
                    self.inputs["url"] = source
                    self.values[flag] = [source.as_uri()]
                elif dest in ("package", "name"):  # a module or hub name, not a path
                    self.values[flag] = ["some_name"]
                else:
                    # .json: a prefix output (PATH + ".json") can be made to collide with it
                    # each in a folder of its own: the folder above it holds only it
                    path = tmp / "inputs" / dest / f"{dest}.json"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(f"the user's {dest}\n")
                    self.inputs[dest] = path
                    # build-index's shards are prefixes: the input file is PREFIX.json
                    given = str(path).removesuffix(".json") if dest == "shards" else str(path)
                    self.values[flag] = [given]
        if SUBCOMMANDS[name]._defaults.get("trains"):
            self.values["--state-dir"] = [str(tmp / "states" / "state")]

    def argv(self, **changed) -> list[str]:
        """The argv with some flags (by dest) given other values."""
        values = dict(self.values)
        for dest, value in changed.items():
            values["--" + dest.replace("_", "-")] = [str(value)]
        return [self.name] + [item for flag, vals in values.items() for item in (flag, *vals)]

    def output_paths(self, dest: str, path: Path) -> list[Path]:
        suffixes = self.outputs[dest]
        return [Path(f"{path}{s}") for s in suffixes] if suffixes else [path]


@pytest.fixture
def recorder(monkeypatch):
    """Every handler replaced: it records its call and writes each declared output (a file,
    or the prefix's files) with fresh content."""
    calls: list[str] = []

    def make(name):
        def handler(args):
            calls.append(args.command)
            for dest, suffixes in args.outputs.items():
                value = getattr(args, dest)
                if value is None:
                    continue
                for path in [Path(f"{value}{s}") for s in suffixes] or [Path(value)]:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(f"written by {args.command} --{dest}\n")

        return handler

    for name in SUBCOMMANDS:
        monkeypatch.setattr(*_handler(name), make(name))
    return calls


def _refused(capsys, argv: list[str], calls: list[str], *names) -> str:
    assert main(argv) == 1, argv
    assert calls == [], f"the command ran: {argv}"
    err = capsys.readouterr().err
    for name in names:
        assert str(name) in err, (name, err)
    assert "Nothing was done" in err
    return err


def test_every_subcommand_declares_its_outputs():
    """Every subcommand but ask, plan-memory and plan-disk writes something; each declared output is
    one of its flags (a flag the guard does not know of would be taken for an input)."""
    assert set(SUBCOMMANDS) - set(WITH_OUTPUTS) == NO_OUTPUTS
    for name in WITH_OUTPUTS:
        dests = {a.dest for a in SUBCOMMANDS[name]._actions}
        assert _outputs_of(name) and set(_outputs_of(name)) <= dests, name
        assert "replace" in dests, name
        assert {"output", "predictions", "metrics", "record"} & dests <= set(_outputs_of(name))


@pytest.mark.parametrize("name", WITH_OUTPUTS)
def test_an_output_never_replaces_an_input(name, tmp_path, recorder, capsys):
    """Output = an input file, a folder above it, or a path inside an input folder: refused
    (with --replace too), naming both flags and paths; the input is left as it was."""
    call = Call(name, tmp_path)
    assert call.inputs, name
    for dest in call.outputs:
        out_flag = f"--{dest.replace('_', '-')}"
        for input_dest, path in call.inputs.items():
            before = path.read_bytes()
            in_flag = f"--{input_dest.replace('_', '-')}"
            # a prefix output collides when one of its files (PREFIX.json) is the input
            same = Path(str(path).removesuffix(".json")) if call.outputs[dest] else path
            _refused(capsys, call.argv(**{dest: same}) + ["--replace"], recorder, out_flag,
                     in_flag, path)  # fmt: skip
            assert path.read_bytes() == before
            if not call.outputs[dest]:  # (a prefix's files sit beside the folder it names)
                _refused(capsys, call.argv(**{dest: path.parent}), recorder, "folder above",
                         in_flag, path.parent)  # fmt: skip
                assert path.read_bytes() == before
        # inside an input folder (any input may be a folder: a model, an index, a store)
        folder_dest = next(d for d in call.inputs if d != "url")
        folder = tmp_path / "inputs" / f"{folder_dest}_folder"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text("{}")
        argv = call.argv(**{folder_dest: folder, dest: folder / "inside"})
        _refused(capsys, argv, recorder, "is inside", folder)
        assert os.listdir(folder) == ["config.json"]


@pytest.mark.parametrize("name", WITH_OUTPUTS)
def test_an_existing_output_is_replaced_only_when_fid_wrote_it(name, tmp_path, recorder, capsys):
    """A file the user wrote at the output: refused, kept; --replace replaces it. fid's own
    output of the same command: replaced. That output changed since: refused."""
    call = Call(name, tmp_path)
    dest = next(iter(call.outputs))
    written = call.output_paths(dest, tmp_path / "out" / dest)
    written[0].parent.mkdir(parents=True, exist_ok=True)
    written[0].write_text("the user's own file\n")
    _refused(capsys, call.argv(), recorder, written[0].parent / dest, "no record of writing it")
    assert written[0].read_text() == "the user's own file\n"

    assert main(call.argv() + ["--replace"]) == 0
    assert recorder == [name] and written[0].read_text().startswith(f"written by {name}")
    marker = written[0].parent / f".{dest}{MARKER_SUFFIX}"
    assert json.loads(marker.read_text())["kind"] == f"fid {name} --{dest.replace('_', '-')}"

    assert main(call.argv()) == 0  # fid's own output of this command: replaced as it was
    assert recorder == [name, name]

    written[-1].write_text("edited by hand since\n")
    recorder.clear()
    _refused(capsys, call.argv(), recorder, "changed since")
    assert written[-1].read_text() == "edited by hand since\n"


@pytest.mark.parametrize("name", [n for n in WITH_OUTPUTS if len(_outputs_of(n)) > 1])
def test_two_outputs_of_one_call_differ(name, tmp_path, recorder, capsys):
    call = Call(name, tmp_path)
    first, second = list(call.outputs)
    same = tmp_path / "out" / "same"
    _refused(capsys, call.argv(**{first: same, second: same}), recorder, "the other output")


@pytest.mark.parametrize(
    "name", [n for n in WITH_OUTPUTS if SUBCOMMANDS[n]._defaults.get("trains")]
)
def test_the_output_is_never_the_training_state(name, tmp_path, recorder, capsys):
    """--output equal to --state-dir, above it or inside it; and inside --state-root."""
    call = Call(name, tmp_path)
    state = tmp_path / "states" / "state"
    for output in (state, state.parent, state / "model"):
        _refused(capsys, call.argv(output=output), recorder, "the training state", state)
    argv = call.argv(output=tmp_path / "root" / "model")
    at = argv.index("--state-dir")
    argv[at : at + 2] = ["--state-root", str(tmp_path / "root")]
    _refused(capsys, argv, recorder, "--state-root", tmp_path / "root")


def test_a_log_file_is_never_an_input(tmp_path, recorder, capsys):
    call = Call("build-bm25", tmp_path)
    passages = call.inputs["passages"]
    before = passages.read_bytes()
    _refused(capsys, ["--log-file", str(passages), *call.argv()], recorder, "--log-file",
             "--passages")  # fmt: skip
    assert passages.read_bytes() == before


def test_another_commands_output_is_not_replaced(tmp_path, recorder, capsys):
    """An output fid wrote as another kind (a passage store) is not replaced by build-bm25."""
    store = Call("build-passage-store", tmp_path)
    assert main(store.argv(output=tmp_path / "out" / "shared")) == 0
    recorder.clear()
    bm25 = Call("build-bm25", tmp_path)
    _refused(capsys, bm25.argv(output=tmp_path / "out" / "shared"), recorder,
             "fid build-passage-store --output", "not as `fid build-bm25 --output`")  # fmt: skip


# ---------------------------------------------------------------- the real commands


@pytest.fixture
def tsv(tmp_path) -> Path:
    rows = ["id\ttext\ttitle"] + [f"{i}\tpassage {i} about the river Tarn and more\tT{i}"
                                  for i in range(8)]  # fmt: skip
    path = tmp_path / "data" / "p.tsv"
    path.parent.mkdir()
    path.write_text("\n".join(rows) + "\n")
    return path


def test_build_passage_store_over_its_corpus_is_refused(tsv, capsys):
    before = tsv.read_bytes()
    assert main(["build-passage-store", "--passages", str(tsv), "--output", str(tsv)]) == 1
    assert "is also the input --passages" in capsys.readouterr().err
    assert tsv.read_bytes() == before and not tsv.with_name(".p.tsv.old").exists()


def test_build_index_over_a_run_folder_is_refused(tmp_path, tsv, capsys):
    """A typo that named a run folder as the index output: its files stay, exit 1."""
    run = tmp_path / "results" / "demo"
    (run / "iter0" / "reader" / "model").mkdir(parents=True)
    (run / "iter0" / "reader" / "model" / "model.safetensors").write_bytes(b"weights")
    (run / "report.json").write_text("{}")
    listing = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert main(["build-index", "--shards", str(tmp_path / "shard0"), "--output", str(run)]) == 1
    assert "no record of writing it" in capsys.readouterr().err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == listing


def test_a_rerun_replaces_fids_own_output(tsv, tmp_path):
    store = tmp_path / "store"
    argv = ["build-passage-store", "--passages", str(tsv), "--output", str(store)]
    assert main(argv) == 0 and main(argv) == 0
    assert (store / "store.json").is_file()
    assert (tmp_path / f".store{MARKER_SUFFIX}").is_file()


def test_eval_reader_metrics_over_its_questions_is_refused(tmp_path, tiny_model_dir, toy_records,
                                                           capsys):  # fmt: skip
    questions = write_json(tmp_path / "q.json", toy_records["dev"][:2])
    before = questions.read_bytes()
    for flag in ("--metrics", "--predictions"):
        other = "--predictions" if flag == "--metrics" else "--metrics"
        argv = ["eval-reader", "--model", str(tiny_model_dir), "--questions", str(questions),
                flag, str(questions), other, str(tmp_path / "other.json")]  # fmt: skip
        assert main(argv) == 1
        assert f"{flag} {questions} is also the input --questions" in capsys.readouterr().err
        assert questions.read_bytes() == before


def test_train_reader_output_is_not_its_state(tmp_path, tiny_model_dir, toy_records, capsys):
    train = write_json(tmp_path / "train.json", toy_records["train"][:2])
    folder = tmp_path / "X"
    argv = ["train-reader", "--train", str(train), "--dev", str(train), "--init-model",
            str(tiny_model_dir), "--output", str(folder), "--state-dir", str(folder)]  # fmt: skip
    assert main(argv) == 1
    assert "is also the training state --state-dir" in capsys.readouterr().err
    assert not folder.exists()


def test_empty_folders_and_removed_files_lose_nothing(tsv, tmp_path):
    """Snakemake makes the folders of a job's outputs before it runs (empty: replaced), and
    deletes a job's declared files before a rerun (what is left is fid's, unchanged:
    replaced); a file added since is refused."""
    store = tmp_path / "store"
    (store / "sub" / "deeper").mkdir(parents=True)
    argv = ["build-passage-store", "--passages", str(tsv), "--output", str(store)]
    assert main(argv) == 0
    (store / "ids.npy").unlink()
    assert main(argv) == 0
    (store / "notes.txt").write_text("mine")
    assert main(argv) == 1
    assert (store / "notes.txt").read_text() == "mine"
