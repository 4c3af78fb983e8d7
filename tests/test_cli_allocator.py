"""The CLI configures polars' jemalloc before polars is imported (cli.JEMALLOC_CONF).

Checked by what jemalloc itself reports: `stats_print:true` makes it print its options at exit.
Polars ships jemalloc on Linux x86-64/aarch64 only; elsewhere there is nothing to configure."""

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
