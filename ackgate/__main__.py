"""``python -m ackgate``: the same command line as the ``ackgate`` console script."""

import sys

from ackgate._operating.cli import main

if __name__ == "__main__":
    sys.exit(main())
