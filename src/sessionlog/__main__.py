"""`python -m sessionlog`: the command line, as `sessionlog` (where the script is not on PATH)."""

import sys

from .cli import main

sys.exit(main())
