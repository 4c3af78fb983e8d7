"""User-facing failures: one line saying what is wrong and what to do, never a traceback."""


class StepscopeError(Exception):
    """An error whose message is meant for the user as-is (the CLI prints it and exits 2)."""

    exit_code = 2


class InputError(StepscopeError):
    """The input file is unusable (not SQLite, truncated, missing tables, no steps, ...)."""


class EnvironmentProblem(StepscopeError):
    """Something this machine lacks (nsys, ncu, a GPU, vLLM)."""
