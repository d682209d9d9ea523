"""The errors that bad input causes (as opposed to bugs in fid).

`fid` (fid/cli) reports an `InputError` in one line that names the file and what was expected,
and exits with status 1; any other exception is a bug in fid and keeps its traceback. Every
stage raises these (or a subclass of its own, e.g. `ConfigError`, `ModelFolderError`).
"""

from __future__ import annotations


class InputError(ValueError):
    """A file, folder or flag value the user gave is missing or not what the command expects.

    The message names the file (and record, line or key) and says what was found and what was
    expected. Subclass it for new kinds of bad input.
    """


class ConfigError(InputError):
    """A configuration file or value is not what a subcommand accepts (also raised by the
    models for settings no model of their shape can take: a reader variant's knobs)."""


class DataError(InputError):
    """A data file is missing or does not hold what the format promises."""


class CheckpointError(DataError):
    """A checkpoint that does not verify, load or have the expected layout (a training
    checkpoint, a released FiD model), or a state folder without one that does."""
