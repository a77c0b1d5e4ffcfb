"""Errors a user can fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """Bad input: the message names the problem and the fix."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI timeout, `docker stop`) raised as an interrupt, so that the cleanup of Ctrl-C runs for it too."""
