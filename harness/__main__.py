"""``python -m harness ARGS`` is ``sbench ARGS`` (what jobs run when they call sbench itself)."""

import sys

from .cli import main

sys.exit(main())
