"""Errors a user can cause: bad config, bad CLI flag, bad file.

Entry points catch :class:`UserError` and print its message as one sentence, without a traceback.
"""

import errno

FULL_DISK = frozenset({errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)})
"""The errnos of a write that ran out of room (EDQUOT, a quota, is missing on Windows)."""


class UserError(Exception):
    """A problem the user can fix; the message names the bad value and the fix."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none (an empty file's EOFError)."""
    lines = str(err).splitlines()
    return lines[0] if lines else type(err).__name__
