"""The launch-configuration reads (`launch_config.py`) over a damaged kernel table: the rowid
bisection over a start that is text reads the whole table instead of crashing (issue 30),
reproduced on a damaged copy of a real fixture."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from tests.conftest import FIXTURES, need, ro

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
K = "CUPTI_ACTIVITY_KIND_KERNEL"


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "t.sqlite"
    shutil.copy(need(EAGER), p)
    return p


def test_bisect_over_a_start_of_text(trace):
    from stepscope.launch_config import rows_near

    with sqlite3.connect(trace) as c:
        n = c.execute(f"SELECT COUNT(*) FROM {K}").fetchone()[0]
        c.execute(f"UPDATE {K} SET start = 'x' || start WHERE rowid IN (SELECT rowid FROM {K} ORDER BY rowid "
                  f"LIMIT 50 OFFSET {n // 2 - 25})")
    with ro(trace) as c:
        lo, hi = c.execute(f"SELECT MIN(start), MAX(start) FROM {K} WHERE typeof(start) = 'integer'").fetchone()
        first, last = c.execute(f"SELECT MIN(rowid), MAX(rowid) FROM {K}").fetchone()
        assert rows_near(c, K, lo, hi) == (first, last)  # the whole table, no TypeError
