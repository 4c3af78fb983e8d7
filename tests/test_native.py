"""stepscope/native.py: the CLI sets up native libraries before they load (polars' jemalloc,
numpy's OpenBLAS), and the processes stepscope starts run without those settings.

jemalloc is checked by what it reports itself: `stats_print:true` makes it print its options at
exit. Polars ships jemalloc on Linux x86-64/aarch64 only; elsewhere there is nothing to set."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

PROBE = """
from stepscope import native
native.allocator_returns_freed_pages()
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
    assert opts["narenas"] == "1"  # one arena: what one thread frees, the others reuse


def test_a_users_own_setting_wins():
    opts = _jemalloc_options("dirty_decay_ms:700,narenas:3")
    assert opts["dirty_decay_ms"] == "700"
    assert opts["narenas"] == "3"
    assert opts["muzzy_decay_ms"] == "0"


def test_too_late_once_polars_is_imported():
    code = ("import os, polars; from stepscope import native; before = os.environ.get('_RJEM_MALLOC_CONF');"
            "native.allocator_returns_freed_pages(); print(before == os.environ.get('_RJEM_MALLOC_CONF'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"


def test_numpy_starts_no_blas_threads():
    code = ("import os, sys\nfrom stepscope import native\n"
            "if sys.argv[1] == 'cli': native.no_blas_thread_pool()\n"
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


CHILD_PROBE = """
import json, os
from stepscope import native
from stepscope.capture.run import engine_env
native.setup()
print(json.dumps({"self": {k: os.environ.get(k) for k in ("_RJEM_MALLOC_CONF", "OPENBLAS_NUM_THREADS")},
                  "engine": {k: engine_env("torch").get(k) for k in ("_RJEM_MALLOC_CONF", "OPENBLAS_NUM_THREADS")},
                  "changed": native.child_env(dict(os.environ, OPENBLAS_NUM_THREADS="8"))["OPENBLAS_NUM_THREADS"]}))
"""


@pytest.mark.parametrize("users", [{}, {"_RJEM_MALLOC_CONF": "narenas:2", "OPENBLAS_NUM_THREADS": "4"}])
def test_child_processes_get_the_users_environment_back(users):
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("_RJEM_MALLOC_CONF", "OPENBLAS_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", CHILD_PROBE], env={**env, **users}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    # this process runs with the settings (the user's own jemalloc options after them) ...
    assert got["self"]["_RJEM_MALLOC_CONF"] == ",".join(filter(None, [native_conf(), users.get("_RJEM_MALLOC_CONF")]))
    assert got["self"]["OPENBLAS_NUM_THREADS"] == users.get("OPENBLAS_NUM_THREADS", "1")
    # ... the engine it starts gets exactly what the user had (nothing where they set nothing)
    assert got["engine"] == {k: users.get(k) for k in ("_RJEM_MALLOC_CONF", "OPENBLAS_NUM_THREADS")}
    # a value the caller set on purpose for the child is kept
    assert got["changed"] == "8"


def native_conf() -> str:
    from stepscope import native

    return native.JEMALLOC_CONF
