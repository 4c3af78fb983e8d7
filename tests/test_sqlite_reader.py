"""The SQLite reader (stepscope/ingest/nsys_sqlite.py) on both of its paths: ADBC's Arrow stream
(big tables in rowid slices on threads) and sqlite3 alone (ADBC absent). Both give the same
frames on every committed and foreign export, and those frames hold what SQLite's own sums of
the same tables say; a value of another type is read again typed; rows at rowids no slice bound
would name are read; a file SQLite calls malformed is refused in SQLite's words; the launch
configuration's reads of chosen kernels hold SQLite's rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from stepscope.ingest.graph_replays import REPLAY_ID
import pytest

from stepscope.errors import InputError
from stepscope.ingest import nsys_sqlite as ns
from tests.conftest import EXTERNAL_FILES, FIXTURES, SERVING, CliRunner, gunzipped, mutated, ro, same_trace

K, R = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
EXPORTS = sorted(p for p in FIXTURES.rglob("*.sqlite")) + [
    SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz", SERVING / "llama1b_serve_r16_graph_plain_bare.sqlite.gz"]
BARE = FIXTURES / "round5" / "llama8b_decode_b1_bare.sqlite"


def _read(path: Path, adbc: bool, monkeypatch, calls: list | None = None):
    """The export read through ADBC (`calls` collects the queries it ran) or sqlite3 alone."""
    with monkeypatch.context() as m:
        if adbc:
            pytest.importorskip("adbc_driver_sqlite")
            if calls is not None:
                real = ns._adbc_query
                m.setattr(ns, "_adbc_query", lambda db, sql: calls.append(sql) or real(db, sql))
        else:
            m.setattr(ns, "_attach_adbc", lambda con, p: None)
        return ns.read_nsys_sqlite(path, launch_config=True)


@pytest.mark.parametrize("export", EXPORTS + EXTERNAL_FILES, ids=lambda p: p.name)
def test_same_frames_as_sqlite_sums(export, monkeypatch):
    path = gunzipped(export) if export.name.endswith(".gz") else export
    calls: list = []
    adbc = _read(path, True, monkeypatch, calls)
    same_trace(adbc, _read(path, False, monkeypatch))
    assert any(f"FROM {K}" in sql for sql in calls)  # the kernel table went through ADBC
    with ro(path) as con:  # independent sums: the two tables as SQLite adds them up
        n, total, corr, grid = con.execute(f'SELECT count(*), total("end" - start), total(correlationId), '
                                           f'total(gridX * blockX) FROM {K}').fetchone()
        ids = sorted(set(adbc.api["name_id"].to_list()))
        # sum(): exact in 64 bits (total() is a float, rounded past 2^53)
        an, astart = con.execute(f"SELECT count(*), coalesce(sum(start), 0) FROM {R} WHERE eventClass IN (0, 1) "
                                 f"AND nameId IN ({','.join(map(str, ids)) or 'NULL'})").fetchone()
    # whole-graph replays (a graph-level capture's CUPTI_ACTIVITY_KIND_GRAPH_TRACE rows) are read as
    # one activity each, under stepscope's own name id: counted apart, against their table
    k = adbc.kernels.filter(pl.col("short_id") != REPLAY_ID)
    with ro(path) as con:
        has = con.execute("SELECT 1 FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_GRAPH_TRACE'").fetchone()
        gn = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()[0] if has else 0
    assert adbc.kernels.height - k.height == gn
    assert (k.height, (k["end"] - k["start"]).sum(), k["corr"].sum(), (k["grid_x"] * k["block_x"]).sum()) == \
        (n, total, corr, grid)
    assert (adbc.api.height, adbc.api["start"].sum()) == (an, astart)


def test_a_big_table_is_read_in_slices_on_threads(monkeypatch):
    """The serving run's tables over SLICE_MIN_ROWS: two rowid slices per thread, in rowid
    order, the first without a lower bound: the same frames as sqlite3's one query."""
    path = gunzipped(SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz")
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 1_000)
    monkeypatch.setattr(ns, "read_threads", lambda: 3)
    calls: list = []
    adbc = _read(path, True, monkeypatch, calls)
    for table in (K, R):
        mine = [sql for sql in calls if f"FROM {table}" in sql and "rowid <=" in sql]
        assert len(mine) == 6 and sum("rowid >" not in sql for sql in mine) == 1, mine  # two per thread
    same_trace(adbc, _read(path, False, monkeypatch))


def test_a_value_of_another_type_is_read_again_typed(tmp_path, monkeypatch):
    p = mutated(tmp_path, f"UPDATE {K} SET start = 'x' WHERE rowid IN (3, 7)",
                f"UPDATE {K} SET correlationId = NULL WHERE rowid = 11",
                f"UPDATE {K} SET streamId = 2.5 WHERE rowid = 12")
    calls: list = []
    adbc = _read(p, True, monkeypatch, calls)
    same_trace(adbc, _read(p, False, monkeypatch))
    kernel_reads = [sql for sql in calls if f"FROM {K}" in sql]
    assert len(kernel_reads) == 2 and "typeof(" in kernel_reads[1]  # plain, then typed
    with ro(p) as con:
        n = con.execute(f"SELECT count(*) FROM {K}").fetchone()[0]
    assert adbc.kernels.height == n - 3
    assert f"{K}: 3 of {n:,} rows left out (start not an integer in 2, streamId not an integer in 1)" in adbc.warnings
    assert adbc.kernels.filter(pl.col("corr").is_null()).height == 1  # a NULL it may hold stays NULL


@pytest.mark.parametrize("rowid", [-5, 0, 1 << 60])
def test_rows_at_any_rowid_are_read(tmp_path, monkeypatch, rowid):
    """A kernel row moved to a negative rowid, rowid 0 or 2^60 (a damaged export), the table read
    in slices: every row SQLite counts is read, on both paths, and the documents are the same."""
    p = mutated(tmp_path, f"UPDATE {K} SET rowid = {rowid} WHERE rowid = (SELECT max(rowid) FROM {K} "
                f"WHERE rowid < {1 << 59})", source=BARE)
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 50)
    with ro(p) as con:
        n, total = con.execute(f'SELECT count(*), total("end" - start) FROM {K}').fetchone()
    calls: list = []
    adbc = _read(p, True, monkeypatch, calls)
    assert sum(f"FROM {K}" in sql and "rowid <=" in sql for sql in calls) > 1  # read in slices
    assert (adbc.kernels.height, (adbc.kernels["end"] - adbc.kernels["start"]).sum()) == (n, total)
    same_trace(adbc, _read(p, False, monkeypatch))
    from stepscope.cli import app

    docs = []
    for attach in (ns._attach_adbc, lambda con, path: None):
        with monkeypatch.context() as m:
            m.setattr(ns, "_attach_adbc", attach)
            r = CliRunner().invoke(app, ["analyze", str(p), "--json", "--no-cache"])
        assert r.exit_code == 0, r.output
        docs.append(r.stdout)
    assert docs[0] == docs[1]


def test_a_file_sqlite_calls_malformed_is_refused_in_its_words(tmp_path, monkeypatch):
    """A leaf page amid the kernel table overwritten: SQLite's error, in one line, on both paths."""
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
    for adbc in (True, False):
        with pytest.raises(InputError) as e:
            _read(p, adbc, monkeypatch)
        assert "not a readable SQLite export (" in str(e.value) and "malformed" in str(e.value), str(e.value)
        assert len(str(e.value).splitlines()) == 1


def test_nulls_in_one_slice_of_a_filtered_table(tmp_path, monkeypatch):
    """NULLs met by one slice only, and API slices the filter leaves short: the same frames."""
    p = mutated(tmp_path, f"UPDATE {K} SET correlationId = NULL WHERE rowid IN (11, 12)",
                f"UPDATE {R} SET correlationId = NULL WHERE rowid = (SELECT max(rowid) FROM {R})")
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 100)
    monkeypatch.setattr(ns, "read_threads", lambda: 3)
    calls: list = []
    adbc = _read(p, True, monkeypatch, calls)
    assert sum("rowid <=" in sql for sql in calls) >= 6 and not any("typeof(" in sql for sql in calls)
    same_trace(adbc, _read(p, False, monkeypatch))
    with ro(p) as con:
        want = con.execute(f"SELECT count(*) FROM {K} WHERE correlationId IS NULL").fetchone()[0]
    assert adbc.kernels["corr"].null_count() == want == 2


@pytest.mark.parametrize("damage", [None, f"UPDATE {K} SET gridX = 'x' WHERE rowid = 5",
                                    f"UPDATE {K} SET globalPid = -(globalPid + 12345) WHERE rowid % 7 = 3"])
def test_launch_configuration_reads_sqlites_rows(tmp_path, monkeypatch, damage):
    """launch_config's reads of chosen kernels (phase evidence by name, a step's window, narrowed
    or not) through ADBC in slices and through sqlite3: the same frames, holding SQLite's rows (a
    grid of another type is no grid; a negative globalPid's pid as `(globalPid >> 24) & 16777215`)."""
    from stepscope.launch_config import NsysLaunchConfig

    pytest.importorskip("adbc_driver_sqlite")
    p = mutated(tmp_path, *([damage] if damage else []), source=BARE)
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 50)  # two slices, as a big trace's
    with ro(p) as con:
        ids = [r[0] for r in con.execute(f"SELECT DISTINCT shortName FROM {K} WHERE rowid <= 5")]
        named = f"shortName IN ({','.join(map(str, ids))})"
        lo, hi = con.execute(f"SELECT min(start), (min(start) + max(start)) / 2 FROM {K}").fetchone()
        want = con.execute(f"SELECT count(*), total(CASE WHEN typeof(gridX) = 'integer' THEN gridX END), "
                           f"total(typeof(gridX) != 'integer') FROM {K} WHERE {named}").fetchone()
        pids = sorted({r[0] for r in con.execute(f"SELECT (globalPid >> 24) & 16777215 FROM {K} WHERE {named}")})
        in_window = con.execute(f"SELECT count(*) FROM {K} WHERE deviceId = 0 AND start BETWEEN {lo} AND {hi}"
                                ).fetchone()[0]
    got = {}
    for adbc in (True, False):
        with monkeypatch.context() as m:
            if not adbc:
                m.setattr(ns, "_attach_adbc", lambda con, path: None)
            reader = NsysLaunchConfig(p)
            got[adbc] = (reader(ids), reader.window([0], lo, hi), reader.window([0], lo, hi, narrow=False))
    for a, b in zip(got[True], got[False]):
        assert a.equals(b) and a.schema == b.schema
    by_name, window, whole = got[True]
    assert (by_name.height, by_name["grid_x"].sum(), by_name["grid_x"].null_count()) == want
    assert sorted(set(by_name["pid"].to_list())) == pids
    assert whole.height == in_window
