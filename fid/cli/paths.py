"""Every path a parsed command reads or writes, for the output guard (fid.runtime.output_guard).

The parser names each command's outputs (`outputs` in its defaults: flag -> suffixes, () for a
file or folder); every other path-valued flag is an input, and so is a flag that takes a hub
name or a folder (`--init-model`, `--tokenizer`) when it names an existing path, and a
`file://` URL.
"""

from __future__ import annotations

import argparse
import os
import urllib.parse
from pathlib import Path

from fid.runtime.output_guard import CommandPaths, Output

# Flags that name a folder or a hub name: an input when such a path exists here.
_NAME_OR_PATH = ("init_model", "tokenizer", "model")
# Embedding shard prefixes read by build-index: the files each stands for.
SHARD_SUFFIXES = (".npy", ".ids.npy", ".json")
_STATE = ("state_dir", "state_root")


def command_paths(args: argparse.Namespace) -> CommandPaths:
    """The command's inputs, outputs, state and log file, from its parsed flags."""
    declared: dict[str, tuple[str, ...]] = getattr(args, "outputs", {})
    outputs = [Output(flag, Path(getattr(args, flag)), suffixes)
               for flag, suffixes in declared.items() if getattr(args, flag) is not None]  # fmt: skip
    inputs: list[tuple[str, Path]] = []
    for flag, value in vars(args).items():
        if flag in declared or flag in _STATE or flag == "log_file":
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, Path):
                inputs += _input_files(flag, item)
            elif flag in _NAME_OR_PATH and isinstance(item, str) and os.path.exists(item):
                inputs.append((flag, Path(item)))
    url = getattr(args, "url", None)
    if isinstance(url, str) and url.startswith("file:"):
        inputs.append(("url", Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))))
    state = next(((flag, Path(getattr(args, flag))) for flag in _STATE
                  if getattr(args, flag, None) is not None), None)  # fmt: skip
    return CommandPaths(args.command, outputs, inputs, state, args.log_file)


def _input_files(flag: str, path: Path) -> list[tuple[str, Path]]:
    if flag == "shards":
        return [(flag, Path(f"{path}{suffix}")) for suffix in SHARD_SUFFIXES]
    return [(flag, path)]
