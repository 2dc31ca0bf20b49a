"""``python -m lpsim``: the ``lpsim`` command."""

import sys

from .cli import main

sys.exit(main())
