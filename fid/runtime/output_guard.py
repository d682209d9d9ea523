"""What a command may write over, checked once for every command before it does any work.

An output replaces whatever stands at its path (files by `os.replace`, folders by
`atomic_directory`), so a typo in `--output` could delete a trained run, and an output equal to
an input would turn the corpus into an index. The rules, for every `fid` subcommand alike:

- an output is never an input of the same call, never a folder that holds an input, never
  inside an input folder, never the training state folder (nor its parent or a path inside
  it), and never another output of the call; `--replace` does not lift these;
- an output that already exists is replaced only when it holds no file (the empty folders that
  Snakemake makes for a job's outputs) or fid wrote it there for the same kind of output
  (`fid build-index --output`, ...) and holds nothing else: the marker beside it,
  `.NAME.fid-output` (JSON, without a .json suffix that `*.json` globs would match), records
  the kind and the size and modification time of every file fid wrote (a manifest), and
  every file there now must be one of them, unchanged (removed ones are fine); anything else
  is refused unless the command is given `--replace`;
- a log file (`--log-file`, appended to) is never an input, an output or inside an output.

Each refusal is one error naming both paths, raised before any work. Markers are written by
the command's rank 0 after it succeeded; a run killed between its output's rename and its
marker leaves an unmarked output, which the next run refuses (the safe side) with the hint.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from fid import __version__
from fid.errors import InputError
from fid.runtime.fileio import atomic_write_json

logger = logging.getLogger(__name__)

MARKER_SUFFIX = ".fid-output"
MARKER_FORMAT = "fid-output"
_REPLACE_HINT = "give another path, or add --replace to replace it"


class OutputCollision(InputError):
    """An output would replace an input, the state, another output, or something fid did not
    write there."""


@dataclass(frozen=True)
class Output:
    """One output of a command: a file or folder at `path`, or, with `suffixes`, the files
    `path + suffix` (a prefix, like an embedding shard's)."""

    flag: str
    path: Path
    suffixes: tuple[str, ...] = ()

    @property
    def written(self) -> list[Path]:
        """The paths the command writes for this output."""
        if not self.suffixes:
            return [self.path]
        return [Path(f"{self.path}{suffix}") for suffix in self.suffixes]

    @property
    def marker(self) -> Path:
        return self.path.parent / f".{self.path.name}{MARKER_SUFFIX}"


@dataclass(frozen=True)
class CommandPaths:
    """Every path a command reads or writes: `inputs` and `outputs` as (flag, path), the
    training state folder (or the root it is found under), and the log file it appends to."""

    command: str
    outputs: list[Output]
    inputs: list[tuple[str, Path]] = field(default_factory=list)
    state: tuple[str, Path] | None = None
    log_file: Path | None = None

    def kind(self, output: Output) -> str:
        return f"fid {self.command} --{output.flag.replace('_', '-')}"


def _real(path: Path) -> Path:
    """The path with symlinks and `..` resolved (it need not exist)."""
    return Path(os.path.realpath(path))


def _relation(output: Path, other: Path) -> str | None:
    """How a written path stands to another path: "is", "holds" (a folder above it), "is
    inside", or None."""
    output, other = _real(output), _real(other)
    if output == other:
        return "is"
    if other.is_relative_to(output):
        return "holds"
    if output.is_relative_to(other):
        return "is inside"
    return None


def _flag(flag: str) -> str:
    return f"--{flag.replace('_', '-')}"


def _collision(written: Path, flag: str, relation: str, other: Path, other_flag: str,
               what: str) -> OutputCollision:  # fmt: skip
    said = {"is": "is also", "holds": "is a folder above", "is inside": "is inside"}[relation]
    return OutputCollision(
        f"{_flag(flag)} {written} {said} {what} {_flag(other_flag)} {other}: writing it would "
        f"destroy {'it' if relation != 'is inside' else 'that folder as it is'}. Nothing was "
        "done. Hint: give the output another path (--replace never allows this)"
    )


def check_outputs(paths: CommandPaths, replace: bool = False) -> None:
    """Refuses, before any work, an output that would destroy what the command must not.

    Raises:
        OutputCollision: naming the output and the path it would destroy.
    """
    for output in paths.outputs:
        for written in output.written:
            for flag, given in paths.inputs:
                relation = _relation(written, given)
                if relation is not None:
                    raise _collision(written, output.flag, relation, given, flag, "the input")
            if paths.state is not None:
                relation = _relation(written, paths.state[1])
                if relation is not None:
                    raise _collision(written, output.flag, relation, paths.state[1],
                                     paths.state[0], "the training state")  # fmt: skip
            for other in paths.outputs:
                for other_written in other.written if other is not output else ():
                    relation = _relation(written, other_written)
                    if relation is not None:
                        raise _collision(written, output.flag, relation, other_written,
                                         other.flag, "the other output")  # fmt: skip
    _check_log_file(paths)
    if not replace:
        for output in paths.outputs:
            _check_replaceable(output, paths.kind(output))


def _check_log_file(paths: CommandPaths) -> None:
    if paths.log_file is None:
        return
    for flag, given in paths.inputs:
        if _real(paths.log_file) == _real(given):
            raise OutputCollision(
                f"--log-file {paths.log_file} is also the input {_flag(flag)} {given}: the log "
                "would be appended to it. Nothing was done. Hint: give the log another path"
            )
    for output in paths.outputs:
        for written in output.written:
            if _relation(paths.log_file, written) in ("is", "is inside"):
                raise OutputCollision(
                    f"--log-file {paths.log_file} is (inside) the output {_flag(output.flag)} "
                    f"{written}, which the command replaces: the log would be lost. Nothing "
                    "was done. Hint: give the log another path"
                )


def _entries(output: Output) -> dict[str, list[int]]:
    """[size, mtime_ns] of every file the output holds now, by its name relative to the output
    (a file: ""; a prefix: its suffixes; a folder: every file below it)."""
    entries: dict[str, list[int]] = {}
    if output.suffixes:
        named = [(suffix, Path(f"{output.path}{suffix}")) for suffix in output.suffixes]
    elif output.path.is_dir() and not output.path.is_symlink():
        named = [(str(file.relative_to(output.path)), file)
                 for file in sorted(output.path.rglob("*")) if not file.is_dir()]  # fmt: skip
    else:
        named = [("", output.path)]
    for name, file in named:
        try:
            stat = file.lstat()
        except FileNotFoundError:
            continue
        entries[name] = [stat.st_size, stat.st_mtime_ns]
    return entries


def _exists(output: Output) -> bool:
    return any(os.path.lexists(path) for path in output.written)


def _holds_nothing(path: Path) -> bool:
    """A folder with no file anywhere below it (Snakemake makes the folders of a job's outputs
    before the job runs): replacing it loses nothing."""
    return (
        path.is_dir()
        and not path.is_symlink()
        and not any(not entry.is_dir() or entry.is_symlink() for entry in path.rglob("*"))
    )


def _check_replaceable(output: Output, kind: str) -> None:
    """An existing output is replaced only when its marker says fid wrote it as `kind` and its
    files are the ones fid wrote (same names, sizes and modification times)."""
    if not _exists(output) or (not output.suffixes and _holds_nothing(output.path)):
        return
    where = f"{_flag(output.flag)} {output.path}"
    try:
        marker = json.loads(output.marker.read_text())
        marked_kind, marked_entries = marker["kind"], marker["entries"]
    except FileNotFoundError:
        raise OutputCollision(
            f"{where} exists and fid has no record of writing it (no {output.marker.name} "
            "beside it: another program's, fid's from before such records, or a run killed "
            f"at its very end). Nothing was done. Hint: {_REPLACE_HINT}"
        ) from None
    except (OSError, ValueError, KeyError, TypeError):
        raise OutputCollision(
            f"{where} exists and its record {output.marker} is unreadable. Nothing was done. "
            f"Hint: {_REPLACE_HINT}"
        ) from None
    if marked_kind != kind:
        raise OutputCollision(
            f"{where} exists and was written by `{marked_kind}`, not as `{kind}`: another kind "
            f"of output. Nothing was done. Hint: {_REPLACE_HINT}"
        )
    # Every file there now must be one fid wrote, as it wrote it; files removed since (a
    # workflow deletes a job's declared outputs before it reruns the job) lose nothing.
    now = _entries(output)
    changed = sorted(name for name in now if now[name] != marked_entries.get(name))
    if changed:
        names = ", ".join(name or output.path.name for name in changed[:3])
        raise OutputCollision(
            f"{where} changed since `{kind}` wrote it ({names}: added or modified since "
            f"{marker.get('written', '?')}). Nothing was done. Hint: {_REPLACE_HINT}"
        )


def mark_outputs(paths: CommandPaths) -> None:
    """Writes each existing output's marker (the command succeeded): its kind and files.

    A marker that cannot be written is a warning, not a failure: the output is complete, and
    without its marker the next run only refuses to replace it.
    """
    written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for output in paths.outputs:
        if not _exists(output):
            continue
        record = {"format": MARKER_FORMAT, "kind": paths.kind(output), "fid": __version__,
                  "written": written, "entries": _entries(output)}  # fmt: skip
        try:
            atomic_write_json(output.marker, record)
        except OSError as error:
            logger.warning("%s: could not record that fid wrote it (%s): the next run will "
                           "refuse to replace it without --replace", output.path, error)  # fmt: skip
