"""The thin command line: each command loads, makes one library call, renders.

Heavy imports (polars, the analyses) happen inside the commands so `stepscope --help` stays fast.
"""

from __future__ import annotations

import gc
import os
import sys

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Explains where the time and the bytes of one LLM inference engine step go.",
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Explains where the time and the bytes of one LLM inference engine step go."""


def fail(message: str, code: int = 2) -> None:
    """Print one line to stderr and exit: the only way a command reports a user-facing error."""
    typer.echo(f"stepscope: error: {message}", err=True)
    raise typer.Exit(code)


# --- command registrations -------------------------------------------------------------
# Each module below owns its commands and registers them on `app` when imported.
from stepscope.commands import analyze as _analyze  # noqa: E402,F401
from stepscope.commands import verdicts as _verdicts  # noqa: E402,F401
from stepscope.commands import capture as _capture  # noqa: E402,F401
from stepscope.commands import cells as _cells  # noqa: E402,F401
from stepscope.commands import report as _report  # noqa: E402,F401


def _large_blocks_from_mmap() -> None:
    """glibc: serve blocks of 64 KiB and more straight from mmap, so a freed one goes back to
    the OS. The SQLite reader's Arrow batches are malloc'ed on its worker threads and freed once
    polars has copied them; under glibc's adaptive threshold they stay in per-thread heaps that
    polars (jemalloc) never reuses: ~90 MB of peak RSS per million kernels, for no speed."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD (fixed, not adaptive)
    except (OSError, AttributeError):  # not glibc
        pass


# Polars' jemalloc (polars reads _RJEM_MALLOC_CONF when it is imported, and appends what is
# set here after its own defaults, so a user's own setting still comes last and wins).
# muzzy_decay_ms:0 - freed pages are handed back with MADV_DONTNEED instead of first being
#   parked with MADV_FREE, which Linux leaves in the process's RSS until memory runs short:
#   polars' default (1 s) kept ~45 MB per million kernels of freed frames in peak RSS.
# dirty_decay_ms:100 - freed pages are kept for reuse a tenth of a second instead of half a
#   second: ~30 MB less peak RSS per million kernels, a few more page faults (no change of
#   wall time measured on the 2-core box; README "Performance").
JEMALLOC_CONF = "dirty_decay_ms:100,muzzy_decay_ms:0"


def _allocator_returns_freed_pages() -> None:
    if "polars" in sys.modules:  # too late: the allocator is configured once, at import
        return
    mine = os.environ.get("_RJEM_MALLOC_CONF")
    os.environ["_RJEM_MALLOC_CONF"] = JEMALLOC_CONF + ("," + mine if mine else "")


def _no_blas_thread_pool() -> None:
    """numpy's OpenBLAS starts a thread per core at import, and each spins ~0.1 s waiting for
    matrix work stepscope never gives it: CPU taken from the reader's and polars' threads
    (2.5 % of a million-kernel analysis' samples on the 2-core box, `perf record`)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main() -> None:
    from stepscope.errors import StepscopeError

    # A run allocates its objects once and exits: the cyclic collector would only rescan the
    # hundreds of thousands of objects a big JSON document is made of (reference counting
    # still frees everything that is not a cycle).
    gc.disable()
    _large_blocks_from_mmap()
    _allocator_returns_freed_pages()
    _no_blas_thread_pool()
    try:
        app()
    except SystemExit as e:
        if e.code in (0, None):
            # Done: skip the interpreter's teardown, which frees a million-kernel trace's
            # objects one by one (a quarter of a second); the OS takes the memory back at once.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        raise
    except StepscopeError as e:  # a library error that escaped a command
        typer.echo(f"stepscope: error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        typer.echo("stepscope: interrupted", err=True)
        sys.exit(130)
    except Exception as e:  # a bug, not bad input: still one line unless asked for the traceback
        if os.environ.get("STEPSCOPE_DEBUG"):
            raise
        typer.echo(f"stepscope: internal error: {type(e).__name__}: {e} "
                   "(set STEPSCOPE_DEBUG=1 for the traceback and report it)", err=True)
        sys.exit(3)

