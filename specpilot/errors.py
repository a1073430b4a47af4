"""Errors a user can cause and fix; the CLI prints them as one line and exits non-zero."""


class UserError(Exception):
    """Bad input: a missing file, an inconsistent checkpoint, an unknown name, an out-of-range value."""


class Interrupted(Exception):
    """Ctrl-C during long work: the CLI says what was kept and exits 130."""
