"""benchmarks/run.py reports a child's own peak RSS, not the benchmark process's."""
import importlib.util
import sys
from pathlib import Path

import pytest

_RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"
_spec = importlib.util.spec_from_file_location("stepscope_benchmarks_run", _RUN)
run = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = run  # its dataclasses look their module up
_spec.loader.exec_module(run)  # by path: a module named plain "run" could be anything on sys.path

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss semantics are Linux's")


def test_child_rss_is_its_own_not_the_parents():
    ballast = bytearray(400 << 20)  # this process's RSS grows by 400 MiB (pages touched below)
    ballast[::4096] = b"x" * len(ballast[::4096])
    small, _ = run.run_child([sys.executable, "-c", "pass"])
    big, _ = run.run_child([sys.executable, "-c", "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096])"])
    del ballast
    assert small.rc == 0 and big.rc == 0
    # a bare interpreter is tens of MiB; a forked child of this process would report >= 400 MiB
    assert small.maxrss_bytes < 100 << 20
    assert 200 << 20 <= big.maxrss_bytes < 300 << 20
    assert 0 < small.wall_s < 10


def test_child_exit_code_and_missing_program():
    r, tail = run.run_child([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])
    assert r.rc == 3 and "boom" in tail
    r, _ = run.run_child(["/nonexistent/program"])
    assert r.rc == 127
