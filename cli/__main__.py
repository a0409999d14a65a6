"""`python -m thunder_mw.cli`: the `thunder-mw` command without its console script."""

import sys

from thunder_mw.cli.main import main

__all__: list[str] = []

sys.exit(main())
