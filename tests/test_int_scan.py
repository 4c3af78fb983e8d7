"""The compiled reader of the integer tables (stepscope/ingest/_scan.c, int_scan.py): the same
frames and warnings as the ADBC path on every committed export, on damaged values (read again
typed), on rows it cannot hold (read by ADBC) and on a file SQLite cannot read (ADBC's words)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepscope.errors import InputError
from stepscope.ingest import int_scan
from stepscope.ingest import nsys_sqlite as ns
from tests.conftest import EXTERNAL_FILES, FIXTURES, SERVING, examples, gunzipped, mutated, ro, same_trace

pytest.importorskip("adbc_driver_sqlite")
if int_scan._scan is None:
    pytest.skip("stepscope.ingest._scan was not built (no C compiler or sqlite3.h at install)",
                allow_module_level=True)

K, R = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
EXPORTS = sorted(p for p in FIXTURES.rglob("*.sqlite")) + [
    SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz", SERVING / "llama1b_serve_r16_graph_plain_bare.sqlite.gz"]


def _read(path: Path, native: bool, monkeypatch, calls: list | None = None):
    """The export read with or without _scan; `calls` collects the queries _scan.scan ran. The
    page reader is off: these tests are of scan() (tests/test_page_scan.py: of pages())."""
    monkeypatch.setenv("STEPSCOPE_NATIVE_SCAN", "1" if native else "0")
    monkeypatch.setenv("STEPSCOPE_PAGE_SCAN", "0")
    if calls is not None:
        real = int_scan._scan.scan

        def counted(uri, sql, values, nulls):
            calls.append(sql)
            return real(uri, sql, values, nulls)

        monkeypatch.setattr(int_scan._scan, "scan", counted)
    return ns.read_nsys_sqlite(path, launch_config=True)


def _unread(monkeypatch, kinds=(int_scan.Unread,)) -> list:
    """What the compiled reader left for ADBC to read: each Unread's message (each of `kinds`)."""
    seen, real = [], int_scan.Table.read

    def read(self, *a):
        try:
            return real(self, *a)
        except kinds as e:
            seen.append(str(e))
            raise

    monkeypatch.setattr(int_scan.Table, "read", read)
    return seen


@pytest.mark.parametrize("export", EXPORTS + EXTERNAL_FILES, ids=lambda p: p.name)
def test_same_frames_as_adbc(export, monkeypatch):
    path = gunzipped(export) if export.name.endswith(".gz") else export
    calls: list = []
    native = _read(path, True, monkeypatch, calls)
    same_trace(native, _read(path, False, monkeypatch))
    assert any(f"FROM {K}" in sql for sql in calls)  # the kernel table went through _scan
    with ro(path) as con:  # an independent count: the kernel table as SQLite sums it
        n, total, corr = con.execute(f'SELECT count(*), total("end" - start), total(correlationId) FROM {K}').fetchone()
    k = native.kernels
    assert (k.height, (k["end"] - k["start"]).sum(), k["corr"].sum()) == (n, total, corr)


def test_a_big_table_is_read_in_slices_on_threads(monkeypatch):
    """The serving run's tables over SLICE_MIN_ROWS: read as two rowid slices per thread,
    in rowid order (the same frame as ADBC's)."""
    path = gunzipped(SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz")
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 1_000)
    monkeypatch.setattr(ns, "read_threads", lambda: 3)
    calls: list = []
    native = _read(path, True, monkeypatch, calls)
    assert sum(f"FROM {K}" in sql and "rowid >" in sql for sql in calls) == 6  # two per thread
    assert sum(f"FROM {R}" in sql and "rowid >" in sql for sql in calls) == 6
    same_trace(native, _read(path, False, monkeypatch))


def test_a_value_of_another_type_is_read_again_typed(tmp_path, monkeypatch):
    p = mutated(tmp_path, f"UPDATE {K} SET start = 'x' WHERE rowid IN (3, 7)",
              f"UPDATE {K} SET correlationId = NULL WHERE rowid = 11",
              f"UPDATE {K} SET streamId = 2.5 WHERE rowid = 12")
    calls: list = []
    native = _read(p, True, monkeypatch, calls)
    same_trace(native, _read(p, False, monkeypatch))
    kernel_reads = [sql for sql in calls if f"FROM {K}" in sql]
    assert len(kernel_reads) == 2 and "typeof(" in kernel_reads[1]  # plain, then typed: both compiled
    with ro(p) as con:
        n = con.execute(f"SELECT count(*) FROM {K}").fetchone()[0]
    assert native.kernels.height == n - 3
    assert f"{K}: 3 of {n:,} rows left out (start not an integer in 2, streamId not an integer in 1)" in native.warnings
    assert native.kernels.filter(pl.col("corr").is_null()).height == 1  # a NULL it may hold stays NULL


def test_rows_beyond_the_rowid_range_are_read_by_adbc(tmp_path, monkeypatch):
    """A row with a negative rowid: max(rowid) no longer bounds the rows, _scan stops, ADBC
    reads the table (the same frame, the row included)."""
    p = mutated(tmp_path, f"INSERT INTO {K} SELECT * FROM {K} WHERE rowid = 1", f"UPDATE {K} SET rowid = -5 "
              f"WHERE rowid = (SELECT max(rowid) FROM {K})")
    unread = _unread(monkeypatch)
    native = _read(p, True, monkeypatch)
    assert len(unread) == 1 and unread[0].startswith("more than")
    same_trace(native, _read(p, False, monkeypatch))
    with ro(p) as con:
        assert native.kernels.height == con.execute(f"SELECT count(*) FROM {K}").fetchone()[0]


def test_a_file_sqlite_cannot_read_reads_as_adbc_says(tmp_path, monkeypatch):
    """A leaf page amid the kernel table overwritten: the table's last rowid still reads (the
    slices are planned), its scan meets the damage; ADBC reads it again and says what is wrong."""
    src = FIXTURES / "llama8b_decode_b1_eager.sqlite"
    with ro(src) as con:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        pages = [r[0] for r in con.execute(f"SELECT pageno FROM dbstat WHERE name = '{K}' AND pagetype = 'leaf' "
                                           "ORDER BY pageno")]
    p = tmp_path / "damaged.sqlite"
    shutil.copy(src, p)
    with open(p, "r+b") as f:
        f.seek((pages[len(pages) // 2] - 1) * size)
        f.write(b"\xff" * size)
    errors, unread = [], _unread(monkeypatch)
    for native in (True, False):
        with pytest.raises(InputError) as e:
            _read(p, native, monkeypatch)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    assert "not a readable SQLite export (" in errors[0] and "database disk image is malformed" in errors[0]
    assert unread and "malformed" in unread[0]  # _scan met the damage first


def test_scan_reports_its_own_failures():
    import numpy as np

    uri = (FIXTURES / "llama8b_decode_b1_eager.sqlite").resolve().as_uri() + "?mode=ro"
    def frame(sql: str, names: list[str], capacity: int) -> pl.DataFrame:
        table = int_scan.Table(names, [capacity])
        table.read(0, uri, sql)
        return table.frame()

    with pytest.raises(int_scan.NotIntegers):
        frame("SELECT id, value FROM StringIds", ["id", "value"], 10_000)
    with pytest.raises(int_scan.Unread, match="more than 5 rows"):
        frame(f"SELECT start FROM {K}", ["start"], 5)
    with pytest.raises(int_scan.Unread, match="no such table"):
        frame("SELECT x FROM nope", ["x"], 5)
    with pytest.raises(ValueError):  # one buffer per column
        int_scan._scan.scan(uri, f"SELECT start FROM {K}", (np.empty(4, np.int64),), ())
    with pytest.raises(TypeError):  # a mistake in the call is not a value of another type
        int_scan._scan.scan(uri, f"SELECT start FROM {K}", [np.empty(4, np.int64)], (np.empty(4, np.uint8),))
    assert not issubclass(int_scan._scan.NotIntegers, TypeError)
    got = frame(f"SELECT start, NULL FROM {K} ORDER BY rowid LIMIT 3", ["start", "none"], 3)
    with ro(FIXTURES / "llama8b_decode_b1_eager.sqlite") as con:
        first = [r[0] for r in con.execute(f"SELECT start FROM {K} ORDER BY rowid LIMIT 3")]
    assert got["start"].to_list() == first and got["none"].null_count() == 3


def test_nulls_in_one_slice_of_a_filtered_table(tmp_path, monkeypatch):
    """NULLs met by one slice only (the others never wrote their flags), and API slices that the
    filter leaves short (moved together): the same frames as ADBC's."""
    p = mutated(tmp_path, f"UPDATE {K} SET correlationId = NULL WHERE rowid IN (11, 12)",
              f"UPDATE {R} SET correlationId = NULL WHERE rowid = (SELECT max(rowid) FROM {R})")
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 100)
    monkeypatch.setattr(ns, "read_threads", lambda: 3)
    calls: list = []
    native = _read(p, True, monkeypatch, calls)
    assert sum("rowid >" in sql for sql in calls) >= 6 and not any("typeof(" in sql for sql in calls)
    same_trace(native, _read(p, False, monkeypatch))
    assert native.kernels["corr"].null_count() == 2


@pytest.mark.parametrize("damaged", [False, True])
def test_launch_configuration_reads_thesame_trace(tmp_path, monkeypatch, damaged):
    """launch_config's reads of chosen kernels (phase evidence, a step's window) through the
    compiled reader: the same rows as ADBC's, and as SQLite's own (a gridX of another type: the
    compiled reader stops, the other path reads it as no grid)."""
    from stepscope.launch_config import NsysLaunchConfig

    p = mutated(tmp_path, *([f"UPDATE {K} SET gridX = 'x' WHERE rowid = 5"] if damaged else []),
              source=FIXTURES / "round5" / "llama8b_decode_b1_bare.sqlite")
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 50)  # two slices, as a big trace's
    with ro(p) as con:
        ids = [r[0] for r in con.execute(f"SELECT DISTINCT shortName FROM {K} WHERE rowid <= 5")]
        lo, hi = con.execute(f"SELECT min(start), (min(start) + max(start)) / 2 FROM {K}").fetchone()
        want = con.execute(f"SELECT count(*), total(CASE WHEN typeof(gridX) = 'integer' THEN gridX END), "
                           f"total(typeof(gridX) != 'integer') FROM {K} WHERE shortName IN ({','.join(map(str, ids))})"
                           ).fetchone()
    got = {}
    monkeypatch.setenv("STEPSCOPE_PAGE_SCAN", "0")
    for native in (True, False):
        monkeypatch.setenv("STEPSCOPE_NATIVE_SCAN", "1" if native else "0")
        unread, reader = _unread(monkeypatch, (int_scan.NotIntegers, int_scan.Unread)), NsysLaunchConfig(p)
        got[native] = (reader(ids), reader.window([0], lo, hi), reader.window([0], lo, hi, narrow=False))
        assert bool(unread) == (native and damaged)
    for a, b in zip(got[True], got[False]):
        assert a.equals(b) and a.schema == b.schema
    by_name = got[True][0]
    # a grid of another type is no grid: null (the row stays, as its start and call do)
    assert (by_name.height, by_name["grid_x"].sum(), by_name["grid_x"].null_count()) == (want[0], want[1], want[2])
    assert want[2] == damaged


def test_a_sparse_rowid_is_not_allocated_for(tmp_path, monkeypatch):
    """A kernel row moved to rowid 2^60 (a damaged export): its slices' ranges are far beyond
    the rows the file can hold, so the compiled reader is not asked to allocate for them (it
    was, once: numpy's 'array is too big', exit 3); ADBC reads the table, and the launch
    configuration of the bare step (phase evidence) reads the same. The whole document is
    the same on both paths."""
    from tests.conftest import CliRunner
    from stepscope.cli import app

    p = mutated(tmp_path, f"UPDATE {K} SET rowid = 1 << 60 WHERE rowid = (SELECT max(rowid) FROM {K})",
              source=FIXTURES / "round5" / "llama8b_decode_b1_bare.sqlite")
    docs = []
    for native in (True, False):
        monkeypatch.setenv("STEPSCOPE_NATIVE_SCAN", "1" if native else "0")
        r = CliRunner().invoke(app, ["analyze", str(p), "--json", "--no-cache"])
        assert r.exit_code == 0, r.output
        docs.append(r.stdout)
    assert docs[0] == docs[1]
    with ro(p) as con:
        n = con.execute(f"SELECT count(*) FROM {K}").fetchone()[0]
    assert _read(p, True, monkeypatch).kernels.height == n
    with pytest.raises(int_scan.Unread, match="rows: "):  # and arrays no machine lends: Unread
        int_scan.Table(["a"], [1 << 62])


_INT = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 2**31, -(2**63)]), st.none())


@examples(60, 20)
@given(rows=st.lists(st.tuples(_INT, _INT, _INT), max_size=60), gaps=st.sets(st.integers(1, 60), max_size=10),
       parts=st.integers(1, 5), filtered=st.booleans())
def test_table_reads_what_sqlite_returns(tmp_path_factory, rows, gaps, parts, filtered):
    """int_scan.Table against Python's sqlite3 on the same query: any integers and NULLs, rowids
    with holes, any number of slices, a filter that leaves slices short."""
    p = tmp_path_factory.mktemp("t") / "t.sqlite"
    with sqlite3.connect(p) as con:
        con.execute("CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER)")
        con.executemany("INSERT INTO t (rowid, a, b, c) VALUES (?, ?, ?, ?)",
                        [(i + 1, *r) for i, r in enumerate(rows)])
        con.execute(f"DELETE FROM t WHERE rowid IN ({','.join(map(str, gaps)) or 'NULL'})")
    with ro(p) as con:
        last = con.execute("SELECT max(rowid) FROM t").fetchone()[0] or 0
        where = "(a IS NULL OR a % 3 != 0)" if filtered else "1"
        want = con.execute(f"SELECT a, b, c FROM t WHERE {where} ORDER BY rowid").fetchall()
    cuts = [last * i // parts for i in range(parts + 1)]
    table = int_scan.Table(["a", "b", "c"], [cuts[i + 1] - cuts[i] for i in range(parts)])
    uri = p.resolve().as_uri() + "?mode=ro"
    for i in range(parts):
        table.read(i, uri, f"SELECT a, b, c FROM t WHERE {where} AND rowid > {cuts[i]} AND rowid <= {cuts[i + 1]}")
    got = table.frame()
    assert got.schema == pl.Schema({"a": pl.Int64, "b": pl.Int64, "c": pl.Int64})
    assert got.rows() == want
