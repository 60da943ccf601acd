"""What the command-line scripts share: a user's mistake is one sentence on stderr and exit status 2."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from mtp.errors import UserError


def run_script(main: Callable[[], int | None]) -> NoReturn:
    """Run a script's ``main`` and exit with its status; a UserError prints ``error: <sentence>`` and exits 2."""
    try:
        status = main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status or 0)
