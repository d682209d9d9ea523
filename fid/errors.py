"""The base class of the errors that bad input causes (as opposed to bugs in fid).

`fid` (fid/cli.py) reports an `InputError` in one line that names the file and what was
expected, and exits with status 1; any other exception is a bug in fid and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """A file, folder or flag value the user gave is missing or not what the command expects.

    The message names the file (and record, line or key) and says what was found and what was
    expected. Subclass it (or `fid.data.DataError`) for new kinds of bad input.
    """
