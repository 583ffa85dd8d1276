"""Errors that reach the user as a clear message and exit code 2 (bad input), not a traceback."""


class UserError(Exception):
    """Bad input from the user: a file, field or value that cannot be used.

    The message must name the offending file, field or line. The CLI prints it and exits with code 2.
    """

    exit_code = 2
