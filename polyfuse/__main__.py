"""``python -m polyfuse``: the same as the ``polyfuse`` command."""

import sys

from polyfuse.cli import main

if __name__ == "__main__":
    sys.exit(main())
