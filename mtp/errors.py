"""Errors a user can cause: bad config, bad CLI flag, bad file.

Entry points catch :class:`UserError` and print its message as one sentence, without a traceback.
"""


class UserError(Exception):
    """A problem the user can fix; the message names the bad value and the fix."""
