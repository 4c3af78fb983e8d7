"""The CLI sets up native libraries before they load: polars' jemalloc (cli.JEMALLOC_CONF) and
numpy's OpenBLAS.

jemalloc is checked by what it reports itself: `stats_print:true` makes it print its options at
exit. Polars ships jemalloc on Linux x86-64/aarch64 only; elsewhere there is nothing to set."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

PROBE = """
import stepscope.cli as cli
cli._allocator_returns_freed_pages()
import polars as pl
pl.DataFrame({"a": range(100_000)}).sum()
"""


def _jemalloc_options(user_conf: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    env["_RJEM_MALLOC_CONF"] = ",".join(filter(None, [user_conf, "stats_print:true"]))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    opts = dict(re.findall(r"^\s*opt\.(\w+): (\S+)", out.stdout + out.stderr, re.M))
    if not opts:
        pytest.skip("this polars build does not use jemalloc")
    return opts


def test_freed_pages_go_back_to_the_os():
    opts = _jemalloc_options(None)
    assert opts["muzzy_decay_ms"] == "0"
    assert opts["dirty_decay_ms"] == "100"


def test_a_users_own_setting_wins():
    opts = _jemalloc_options("dirty_decay_ms:700")
    assert opts["dirty_decay_ms"] == "700"
    assert opts["muzzy_decay_ms"] == "0"


def test_too_late_once_polars_is_imported():
    code = ("import os, polars, stepscope.cli as cli; before = os.environ.get('_RJEM_MALLOC_CONF');"
            "cli._allocator_returns_freed_pages(); print(before == os.environ.get('_RJEM_MALLOC_CONF'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"


def test_numpy_starts_no_blas_threads():
    code = ("import os, sys, stepscope.cli as cli\n"
            "if sys.argv[1] == 'cli': cli._no_blas_thread_pool()\n"
            "before = len(os.listdir('/proc/self/task'))\n"
            "import numpy\n"
            "print(len(os.listdir('/proc/self/task')) - before)")
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}

    def added(arg: str) -> int:
        out = subprocess.run([sys.executable, "-c", code, arg], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return int(out.stdout)

    assert added("cli") == 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores > 1:
        assert added("plain") > 0  # the pool the setting prevents (one thread per extra core)
