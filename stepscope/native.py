"""The native libraries under stepscope's own process: glibc's malloc, polars' jemalloc and
numpy's OpenBLAS, set up by the CLI before they load (`setup()`).

The settings tune stepscope's one-shot analysis of a big trace, not the user's programs: a
process stepscope starts (the engine under nsys, the ncu workload) gets the environment it
would have had without them (`child_env()`).
"""

from __future__ import annotations

import os
import sys

# Polars' jemalloc (polars reads _RJEM_MALLOC_CONF when it is imported, and appends what is
# set here after its own defaults, so a user's own setting still comes last and wins).
# muzzy_decay_ms:0 - freed pages are handed back with MADV_DONTNEED instead of first being
#   parked with MADV_FREE, which Linux leaves in the process's RSS until memory runs short:
#   polars' default (1 s) kept ~45 MB per million kernels of freed frames in peak RSS.
# dirty_decay_ms:100 - freed pages are kept for reuse a tenth of a second instead of half a
#   second: ~30 MB less peak RSS per million kernels, a few more page faults (no change of
#   wall time measured on the 2-core box; README "Performance").
# narenas:1 - one arena for all of polars' threads instead of four per core: a page one thread
#   frees is reused by the next allocation of any thread within the decay time, instead of
#   waiting in its own thread's arena while another faults in fresh pages, which cost
#   microseconds each on the virtual machines measured (CHANGELOG.md, round seven): a cold
#   1M analysis faulted 160-193 k pages instead of 215-237 k, 0.9x the wall, the same peak RSS.
JEMALLOC_CONF = "narenas:1,dirty_decay_ms:100,muzzy_decay_ms:0"

_users: dict[str, str | None] = {}  # variable set by setup() -> the user's own value (None: unset)


def _set(key: str, value: str) -> None:
    _users.setdefault(key, os.environ.get(key))
    os.environ[key] = value


def large_blocks_from_mmap() -> None:
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


def allocator_returns_freed_pages() -> None:
    if "polars" in sys.modules:  # too late: the allocator is configured once, at import
        return
    mine = os.environ.get("_RJEM_MALLOC_CONF")
    _set("_RJEM_MALLOC_CONF", JEMALLOC_CONF + ("," + mine if mine else ""))


def no_blas_thread_pool() -> None:
    """numpy's OpenBLAS starts a thread per core at import, and each spins ~0.1 s waiting for
    matrix work stepscope never gives it: CPU taken from the reader's and polars' threads
    (2.5 % of a million-kernel analysis' samples on the 2-core box, `perf record`)."""
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        _set("OPENBLAS_NUM_THREADS", "1")


def setup() -> None:
    large_blocks_from_mmap()
    allocator_returns_freed_pages()
    no_blas_thread_pool()


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (default: this process's environment) without what setup() set: the
    user's own values back where setup() replaced them. A value `base` itself changed stays."""
    env = dict(os.environ if base is None else base)
    for key, users in _users.items():
        if env.get(key) != os.environ.get(key):
            continue
        if users is None:
            env.pop(key, None)
        else:
            env[key] = users
    return env
