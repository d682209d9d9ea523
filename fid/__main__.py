"""`python -m fid` is the `fid` command."""

from fid.cli import command

command()
