"""`python -m fid` is the `fid` command."""

import sys

from fid.cli import main

sys.exit(main())
