"""Typed reading of damaged exports, on both read paths (ADBC and the sqlite3 fallback): a value
of the wrong type, an id beyond 32 bits, a NULL key or a name that is not UTF-8 is left out (or
read with U+FFFD) and counted in a warning naming table and column; a missing column is one line naming table and column. Never exit 3,
never a Rust panic."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from stepscope.ingest import nsys_sqlite as ns
from tests.conftest import FIXTURES, mutated, need, sha256

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
K = "CUPTI_ACTIVITY_KIND_KERNEL"


@pytest.fixture(params=["adbc", "sqlite3"])
def path_kind(request, monkeypatch):
    """The read path: ADBC (the tables' Arrow stream), or sqlite3 alone (ADBC absent)."""
    if request.param == "sqlite3":
        monkeypatch.setattr(ns, "_attach_adbc", lambda con, p: None)
    else:
        pytest.importorskip("adbc_driver_sqlite")
    return request.param


def analyze(p):
    before = sha256(p)
    r = CliRunner().invoke(app, ["analyze", str(p), "--json", "--no-cache"])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert sha256(p) == before
    return r


def analyzed(p) -> dict:
    r = analyze(p)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def one_line(r, code=2) -> str:
    assert r.exit_code == code, r.output
    err = r.output.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "SELECT" not in err, err
    return err


@pytest.mark.parametrize("where,sql,warning", [
    ("rowid = 5", f"UPDATE {K} SET start = 'abc' WHERE rowid = 5", "start not an integer in 1"),
    ("rowid = 5", f"UPDATE {K} SET start = 1.5 WHERE rowid = 5", "start not an integer in 1"),
    ("rowid = 5", f"UPDATE {K} SET correlationId = x'0102' WHERE rowid = 5", "correlationId not an integer in 1"),
    ("rowid = 5", f"UPDATE {K} SET correlationId = 1e30 WHERE rowid = 5", "correlationId not an integer in 1"),
    ("rowid = 5", f"UPDATE {K} SET correlationId = '18446744073709551615' WHERE rowid = 5",
     "correlationId not an integer in 1"),
    ("rowid IN (5, 6)", f"UPDATE {K} SET deviceId = 5000000000 WHERE rowid IN (5, 6)", "deviceId beyond 32 bits in 2"),
    ("rowid = 5", f"UPDATE {K} SET streamId = -5000000000 WHERE rowid = 5", "streamId beyond 32 bits in 1"),
    ("rowid = 5", f"UPDATE {K} SET shortName = 9000000000 WHERE rowid = 5", "shortName beyond 32 bits in 1"),
    ("rowid = 5", f"UPDATE {K} SET globalPid = NULL WHERE rowid = 5", "globalPid NULL in 1"),
])
def test_bad_kernel_values_are_left_out_and_counted(tmp_path, path_kind, where, sql, warning):
    p = mutated(tmp_path, sql)
    doc = analyzed(p)
    n_bad = ns.sqlite3.connect(p).execute(f"SELECT count(*) FROM {K} WHERE {where}").fetchone()[0]
    assert doc["steps"][0]["n_kernels"] == 420 - n_bad
    mine = [w for w in doc["warnings"] if w.startswith(K)]
    assert mine == [f"{K}: {n_bad} of 420 rows left out ({warning})"]


def test_a_null_in_a_not_null_column(tmp_path, path_kind):
    # nsys declares start NOT NULL; a copy of the table without the constraint can hold NULL
    p = mutated(tmp_path, f"CREATE TABLE k2 AS SELECT * FROM {K}", f"DROP TABLE {K}",
                f"ALTER TABLE k2 RENAME TO {K}", f"UPDATE {K} SET start = NULL, end = NULL WHERE rowid <= 3")
    doc = analyzed(p)
    assert doc["steps"][0]["n_kernels"] == 417
    assert f"{K}: 3 of 420 rows left out (end NULL in 3, start NULL in 3)" in doc["warnings"]


def test_wrong_types_after_the_first_batch(tmp_path, path_kind):
    """ADBC types a column from its first 65,536 rows and refused a later value of another
    type (exit 3); a text column whose first batch is all NULL was typed INT64 the same way."""
    src = need(FIXTURES / "llama8b_decode_b1_eager.sqlite")
    p = tmp_path / "big.sqlite"
    shutil.copy(src, p)
    con = sqlite3.connect(p)
    cols = [r[1] for r in con.execute(f"PRAGMA table_info({K})")]
    # 420 kernels × 200 copies: 84,000 rows, shifted so each copy is its own period
    con.execute(f"CREATE TABLE base AS SELECT * FROM {K}")
    con.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 199) "
                f"INSERT INTO {K} ({','.join(cols)}) SELECT "
                + ",".join(f"{c} + n.i * 40000000" if c in ("start", "end") else c for c in cols)
                + " FROM base, n")
    last = con.execute(f"SELECT max(rowid) FROM {K}").fetchone()[0]
    con.execute(f"UPDATE {K} SET start = 'late text' WHERE rowid = ?", (last - 3,))
    # inline NVTX text first NULL, then text, beyond the first batch
    con.execute("CREATE TABLE nv AS SELECT * FROM NVTX_EVENTS")
    con.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 70000) "
                "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) "
                "SELECT 1, 2, 59, CASE WHEN n.i > 69990 THEN 'late' END, globalTid FROM nv, n")
    con.commit()
    con.close()
    tr = ns.read_nsys_sqlite(p)
    assert tr.kernels.height == 84_000 - 1
    assert f"{K}: 1 of 84,000 rows left out (start not an integer in 1)" in tr.warnings
    assert tr.nvtx.filter(tr.nvtx["name"] == "late").height == 10
    assert tr.nvtx["name"].null_count() == 69_990


@pytest.mark.parametrize("sql,table,column", [
    ("UPDATE StringIds SET value = CAST(x'fffe41' AS TEXT) WHERE id = (SELECT shortName FROM "
     f"{K} WHERE rowid = 1)", "StringIds", "value"),
    ("UPDATE NVTX_EVENTS SET text = CAST(x'ff' || CAST(text AS BLOB) AS TEXT)", "NVTX_EVENTS", "text"),
    ("UPDATE NVTX_EVENTS SET text = x'ff00ff'", "NVTX_EVENTS", "text"),
    ("UPDATE TARGET_INFO_GPU SET name = CAST(x'4e56ff' AS TEXT)", "TARGET_INFO_GPU", "name"),
    ("UPDATE StringIds SET value = CAST(x'c3' AS TEXT) WHERE id = (SELECT nameId FROM ThreadNames LIMIT 1)",
     "ThreadNames", "StringIds.value"),
])
def test_names_that_are_not_utf8(tmp_path, path_kind, sql, table, column):
    """ADBC handed polars the invalid bytes as a String column: a Rust panic (PanicException,
    which no `except Exception` catches) when polars read it back."""
    p = mutated(tmp_path, sql)
    doc = analyzed(p)
    assert any(w.startswith(f"{table}: {column} is not UTF-8 in ") for w in doc["warnings"]), doc["warnings"]
    assert doc["steps"][0]["n_kernels"] == 420


def test_a_damaged_name_keeps_the_rest_of_it(tmp_path, path_kind):
    p = mutated(tmp_path, "UPDATE NVTX_EVENTS SET text = CAST(CAST(text AS BLOB) || x'ff' AS TEXT)")
    doc = analyzed(p)
    step = doc["steps"][0]
    assert step["delimiter"] == "nvtx" and step["name"].endswith("\ufffd") and step["phase"] == "decode"


@pytest.mark.parametrize("table,column,needle", [
    (K, "start", f"table {K} has no column start"),
    (K, "shortName", f"table {K} has no column shortName"),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId", "table CUPTI_ACTIVITY_KIND_RUNTIME has no column correlationId"),
    ("NVTX_EVENTS", "globalTid", "table NVTX_EVENTS has no column globalTid"),
    ("StringIds", "value", "table StringIds has no column value"),
    ("CUPTI_ACTIVITY_KIND_MEMSET", "deviceId", "table CUPTI_ACTIVITY_KIND_MEMSET has no column deviceId"),
])
def test_a_missing_column_names_table_and_column(tmp_path, path_kind, table, column, needle):
    p = mutated(tmp_path, f"ALTER TABLE {table} DROP COLUMN {column}")
    err = one_line(analyze(p))
    assert needle in err


@pytest.mark.parametrize("table,column,warning", [
    ("PROCESSES", "pid", "table PROCESSES has no column pid"),
    ("TARGET_INFO_GPU", "id", None),  # falls back to cuDevice
    ("ThreadNames", "nameId", "table ThreadNames or StringIds has no column nameId"),
])
def test_a_missing_descriptive_column_is_a_warning(tmp_path, path_kind, table, column, warning):
    p = mutated(tmp_path, f"ALTER TABLE {table} DROP COLUMN {column}")
    doc = analyzed(p)
    assert doc["steps"][0]["n_kernels"] == 420
    if warning:
        assert any(warning in w for w in doc["warnings"])
    else:
        assert doc["gpus"][0]["name"] == "NVIDIA H200"


@pytest.mark.parametrize("sql,warning", [
    ("UPDATE TARGET_INFO_GPU SET smCount = 'many'", "TARGET_INFO_GPU: 1 of 1 rows left out (smCount not an integer in 1)"),
    ("UPDATE PROCESSES SET pid = 'p' WHERE rowid <= 2", "PROCESSES: 2 of 190 rows left out (pid not an integer in 2)"),
    ("UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET bytes = 'lots'",
     "CUPTI_ACTIVITY_KIND_MEMSET: 1 of 1 rows left out (bytes not an integer in 1)"),
    ("UPDATE NVTX_EVENTS SET globalTid = 'x'", "NVTX_EVENTS: 1 of 1 rows left out (globalTid not an integer in 1)"),
])
def test_other_tables_count_their_bad_rows(tmp_path, path_kind, sql, warning):
    p = mutated(tmp_path, sql)
    assert warning in analyzed(p)["warnings"]


def test_damaged_metadata_and_overhead_rows(tmp_path, path_kind):
    p = mutated(tmp_path, "UPDATE META_DATA_EXPORT SET value = x'ff' WHERE name = 'EXPORT_PRODUCT_VERSION'",
                "UPDATE META_DATA_EXPORT SET value = CAST(x'ff' AS TEXT) WHERE name = 'EXPORT_SCHEMA_VERSION'",
                "UPDATE PROFILER_OVERHEAD SET start = 'x' WHERE rowid = 1",
                "UPDATE PROFILER_OVERHEAD SET end = 9223372036854775807 WHERE rowid = 2")
    doc = analyzed(p)
    assert doc["trace"]["schema_version"] == "\ufffd"
    con = sqlite3.connect(p)
    good = con.execute("SELECT count(*), sum(end - start) FROM PROFILER_OVERHEAD WHERE rowid > 2").fetchone()
    # the row with an absurd end still counts: its duration is an integer; the text one does not
    assert doc["steps"][0]["launch"]["profiler_overhead"]["count"] == good[0] + 1


def test_both_read_paths_agree_on_a_damaged_export(tmp_path, monkeypatch):
    pytest.importorskip("adbc_driver_sqlite")
    p = mutated(tmp_path, f"UPDATE {K} SET start = 'x' WHERE rowid = 3", f"UPDATE {K} SET deviceId = 1e10 WHERE rowid = 4",
                f"UPDATE {K} SET streamId = 99999999999 WHERE rowid = 8",
                "UPDATE NVTX_EVENTS SET text = CAST(CAST(text AS BLOB) || x'fe' AS TEXT)",
                "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 'q' WHERE rowid = 10")
    fast = ns.read_nsys_sqlite(p)
    monkeypatch.setattr(ns, "_attach_adbc", lambda con, path: None)
    slow = ns.read_nsys_sqlite(p)
    for f in ("kernels", "memops", "api", "nvtx", "strings", "gpus", "processes", "threads"):
        assert getattr(fast, f).equals(getattr(slow, f)), f
    assert fast.warnings == slow.warnings
    # 1e10 in an INTEGER column: SQLite stores it as the integer 10,000,000,000
    assert f"{K}: 3 of 420 rows left out (deviceId beyond 32 bits in 1, start not an integer in 1, " \
           "streamId beyond 32 bits in 1)" in fast.warnings


def test_a_damaged_schema_whose_error_is_not_utf8(tmp_path, path_kind):
    """SQLite's message about a damaged schema quotes the damaged text: sqlite3 failed to
    decode its own error (UnicodeDecodeError, exit 3)."""
    data = bytearray(need(EAGER).read_bytes())
    at = data.rfind(b"CREATE TABLE ANALYSIS_DETAILS")  # the live schema row (an older copy sits earlier)
    data[at + 2] = 0x80
    p = tmp_path / "d.sqlite"
    p.write_bytes(bytes(data))
    err = one_line(analyze(p))
    assert "not a readable SQLite export (malformed database schema (ANALYSIS_DETAILS)" in err
