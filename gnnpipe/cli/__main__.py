"""``python -m gnnpipe.cli``: the ``gnnpipe`` command."""

import sys

from gnnpipe.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
