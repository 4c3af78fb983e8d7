"""The command line: the commands (stepscope/commands/*) on one Typer app, and main(), where a
run becomes a process (its exit code, its one line for anything that went wrong).

Heavy imports (polars, the analyses) happen inside the commands so `stepscope --help` stays fast.
"""

from __future__ import annotations

import gc
import os
import sys

import typer

from stepscope.commands import register
from stepscope.commands.app import app, error_exit

register(app)  # every command, in the order stepscope/commands/__init__.py lists them (--help's)

__all__ = ["app", "main", "run"]


def _click_exception() -> type:
    """click's ClickException: typer from 0.2x vendors click as typer._click, older ones use click."""
    try:
        from typer import _click
    except ImportError:
        import click as _click
    return _click.exceptions.ClickException


def run(args=None, prog_name: str | None = None, app=app) -> int:
    """The one error boundary: runs the command line `args` (None: sys.argv's) on `app` and
    returns its exit code. Bad input (StepscopeError, from a command, the library under it or an
    option callback) is one line on stderr and its exit code (commands.app.error_exit), a usage
    error one line and click's code, a bug one line and exit 3 (STEPSCOPE_DEBUG=1: the traceback),
    an interrupt one line and 130. A SystemExit passes through (main() ends on it)."""
    from stepscope.errors import StepscopeError

    try:
        # standalone_mode=False: click hands a usage error (an option value of the wrong type,
        # an unknown option) back instead of printing a usage block in a box, so it gets one
        # line like any other bad input; the exit code comes back as the return value
        code = app(args=args, prog_name=prog_name, standalone_mode=False)
        return 0 if code is None else code
    except _click_exception() as e:
        message = " ".join(e.format_message().split())
        if message:  # empty: no arguments at all, and the help it stands for is printed
            where = e.ctx.command_path if getattr(e, "ctx", None) is not None else "stepscope"
            typer.echo(f"stepscope: error: {message} (see {where} --help)", err=True)
        return e.exit_code
    except SystemExit:
        raise
    except StepscopeError as e:
        return error_exit(e)
    except KeyboardInterrupt:
        typer.echo("stepscope: interrupted", err=True)
        return 130
    except BaseException as e:  # a bug, not bad input: still one line unless asked for the traceback
        # Rust code under polars and ADBC panics with pyo3's PanicException, a BaseException
        # (so that `except Exception` in libraries lets it through): it is a bug like any other
        if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
            raise
        if os.environ.get("STEPSCOPE_DEBUG"):
            raise
        first = (str(e).strip().splitlines() or [""])[0]  # polars appends the failing plan
        typer.echo(f"stepscope: internal error: {type(e).__name__}: {first} "
                   "(set STEPSCOPE_DEBUG=1 for the traceback and report it)", err=True)
        return 3


def main() -> None:
    """The process: run() (the one error boundary) on sys.argv, its code the exit status."""
    # A run allocates its objects once and exits: the cyclic collector would only rescan the
    # hundreds of thousands of objects a big JSON document is made of (reference counting
    # still frees everything that is not a cycle).
    gc.disable()
    # before polars, numpy and the SQLite reader load (see stepscope/native.py)
    from stepscope import native

    native.setup()
    try:
        code = run()
    except SystemExit as e:
        if e.code not in (0, None):
            raise
        code = 0
    if code != 0:
        sys.exit(code)
    # Done: skip the interpreter's teardown, which frees a million-kernel trace's objects one by
    # one (a quarter of a second); the OS takes the memory back at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
