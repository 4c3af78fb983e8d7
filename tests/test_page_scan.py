"""The page reader (`_scan.pages`, `int_scan.page_plan`): the kernel and API tables read from the
export's own B-tree pages give the frames SQLite gives, on every committed export, on random
tables against SQLite itself, and on damaged files; whatever it does not read as SQLite would
(an overflow page, a damaged page) it leaves to SQLite."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from stepscope.ingest import int_scan
from stepscope.ingest import nsys_sqlite as ns
from tests.conftest import EXTERNAL_FILES, FIXTURES, SERVING, examples, gunzipped, mutated, ro, same_trace

pytest.importorskip("adbc_driver_sqlite")
if int_scan._scan is None:
    pytest.skip("stepscope.ingest._scan was not built (no C compiler or sqlite3.h at install)",
                allow_module_level=True)
np = pytest.importorskip("numpy")

K, R = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
EXPORTS = sorted(p for p in FIXTURES.rglob("*.sqlite")) + [
    SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz", SERVING / "llama1b_serve_r16_graph_plain_bare.sqlite.gz"]


def _read(path: Path, mode: str, monkeypatch, calls: list | None = None):
    """The export read by the page reader ("pages"), the compiled scan alone ("scan") or ADBC
    alone ("adbc"). `calls`: ("pages", root, lo, hi, outcome) and ("scan", sql) as they ran."""
    monkeypatch.setenv("STEPSCOPE_NATIVE_SCAN", "0" if mode == "adbc" else "1")
    monkeypatch.setenv("STEPSCOPE_PAGE_SCAN", "1" if mode == "pages" else "0")
    if calls is not None:
        real_pages, real_scan = int_scan._scan.pages, int_scan._scan.scan

        def pages(path, root, fields, filters, lo, hi, values, nulls):
            try:
                out = real_pages(path, root, fields, filters, lo, hi, values, nulls)
            except Exception as e:
                calls.append(("pages", root, lo, hi, type(e).__name__ + ": " + str(e)))
                raise
            calls.append(("pages", root, lo, hi, "ok"))
            return out

        def scan(uri, sql, values, nulls):
            calls.append(("scan", sql))
            return real_scan(uri, sql, values, nulls)

        monkeypatch.setattr(int_scan._scan, "pages", pages)
        monkeypatch.setattr(int_scan._scan, "scan", scan)
    return ns.read_nsys_sqlite(path, launch_config=True)


def _root(path: Path, table: str) -> int:
    with ro(path) as con:
        return con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]


@pytest.mark.parametrize("export", EXPORTS + EXTERNAL_FILES, ids=lambda p: p.name)
def test_same_frames_as_sqlite_and_adbc(export, monkeypatch):
    path = gunzipped(export) if export.name.endswith(".gz") else export
    calls: list = []
    pages = _read(path, "pages", monkeypatch, calls)
    calls = list(calls)  # (the reads below add theirs)
    same_trace(pages, _read(path, "scan", monkeypatch))
    same_trace(pages, _read(path, "adbc", monkeypatch))
    # the kernel and API tables came from their pages, with no slice left to SQLite
    for table in (K, R):
        mine = [c for c in calls if c[0] == "pages" and c[1] == _root(path, table)]
        assert mine and all(c[4] == "ok" for c in mine), (table, mine)
    assert not any(c[0] == "scan" and (f"FROM {K}" in c[1] or f"FROM {R}" in c[1]) for c in calls)
    with ro(path) as con:  # independent sums: the two tables as SQLite adds them up
        n, total, corr, grid = con.execute(f'SELECT count(*), total("end" - start), total(correlationId), '
                                           f'total(gridX * blockX) FROM {K}').fetchone()
        ids = sorted(set(pages.api["name_id"].to_list()))
        # sum(): exact in 64 bits (total() is a float, rounded past 2^53)
        an, astart = con.execute(f"SELECT count(*), coalesce(sum(start), 0) FROM {R} WHERE eventClass IN (0, 1) "
                                 f"AND nameId IN ({','.join(map(str, ids)) or 'NULL'})").fetchone()
    k = pages.kernels
    assert (k.height, (k["end"] - k["start"]).sum(), k["corr"].sum(), (k["grid_x"] * k["block_x"]).sum()) == \
        (n, total, corr, grid)
    assert (pages.api.height, pages.api["start"].sum()) == (an, astart)


def test_slices_are_rowid_spans_of_the_tree(monkeypatch):
    """A big table's slices: each span (lo, hi] read from the pages (the interior pages' keys
    prune the others), in rowid order: the same frames as SQLite's slices."""
    path = gunzipped(SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz")
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 1_000)
    monkeypatch.setattr(ns, "read_threads", lambda: 3)
    calls: list = []
    pages = _read(path, "pages", monkeypatch, calls)
    calls = list(calls)
    with ro(path) as con:
        last = con.execute(f"SELECT max(rowid) FROM {K}").fetchone()[0]
    spans = sorted(c[2:4] for c in calls if c[0] == "pages" and c[1] == _root(path, K))
    assert spans == [(last * i // 6, last * (i + 1) // 6) for i in range(6)]  # two per thread
    assert sum(c[0] == "pages" and c[1] == _root(path, R) for c in calls) == 6
    same_trace(pages, _read(path, "scan", monkeypatch))


def test_an_overflow_page_is_left_to_sqlite(tmp_path, monkeypatch):
    """A kernel row too long for its page (a blob in a column never read): the page reader
    stops at it, SQLite reads the table, and the frames are SQLite's."""
    p = mutated(tmp_path, f"UPDATE {K} SET mangledName = zeroblob(20000) WHERE rowid = 5")
    calls: list = []
    pages = _read(p, "pages", monkeypatch, calls)
    calls = list(calls)
    mine = [c for c in calls if c[0] == "pages" and c[1] == _root(p, K)]
    assert len(mine) == 1 and "overflow page" in mine[0][4]
    assert any(c[0] == "scan" and f"FROM {K}" in c[1] for c in calls)
    same_trace(pages, _read(p, "adbc", monkeypatch))
    assert pages.kernels.height == 420


@pytest.mark.parametrize("what", ["leaf", "internal"])
def test_a_damaged_page_reads_as_sqlite_says(tmp_path, monkeypatch, what):
    """A page of the kernel table's tree overwritten: the page reader leaves it to SQLite, whose
    error (through ADBC's words) is the one reported, as without the page reader."""
    from stepscope.errors import InputError

    src = gunzipped(SERVING / "llama-3.1-8b_serve_r48_s0_eager.sqlite.gz")
    with ro(src) as con:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        pages = [r[0] for r in con.execute(f"SELECT pageno FROM dbstat WHERE name = '{K}' AND pagetype = ? "
                                           "ORDER BY pageno", (what,))]
    p = tmp_path / "damaged.sqlite"
    shutil.copy(src, p)
    with open(p, "r+b") as f:
        f.seek((pages[len(pages) // 2] - 1) * size)
        f.write(b"\x0d" + b"\xff" * (size - 1))  # a leaf's type byte, then nonsense
    errors, calls = [], []
    for mode in ("pages", "scan"):
        with pytest.raises(InputError) as e:
            _read(p, mode, monkeypatch, calls if mode == "pages" else None)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "malformed" in errors[0]
    assert any(c[0] == "pages" and c[4].startswith("RuntimeError") for c in calls)


def _con(tmp_path: Path, *sql: str) -> tuple[Path, sqlite3.Connection]:
    p = tmp_path / "t.sqlite"
    con = sqlite3.connect(p)
    for s in sql:
        con.execute(s)
    con.commit()
    return p, con


def test_what_the_plan_leaves_to_sqlite(tmp_path, monkeypatch):
    p, con = _con(tmp_path, "CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c REAL)",
                  "CREATE TABLE w (a INTEGER PRIMARY KEY, b INTEGER) WITHOUT ROWID", "CREATE VIEW v AS SELECT a FROM t",
                  "CREATE TABLE g (a INTEGER, b INTEGER GENERATED ALWAYS AS (a + 1))",
                  "CREATE TABLE \"Odd\" (A INTEGER, b INTEGER)")
    plan = int_scan.page_plan
    got = plan(con, p, "t", ["a", "NULL", "c"], ["a IN (3, 1, 2)"])
    assert got == int_scan.Pages(str(p), _root(p, "t"), (1, -1, 3), ((1, (1, 2, 3)),))
    assert plan(con, p, "odd", ["a", "B"], []).fields == (0, 1)  # names as SQLite matches them
    for table, cols, where in [
        ("t", ["id"], []),                   # the rowid's alias: not in the record
        ("t", ["a + 1"], []),                # an expression
        ("t", ["1"], []),                    # a number, not a column
        ("t", ["nope"], []),
        ("t", ["a"], ["b IN (1)"]),          # TEXT affinity: IN compares as text
        ("t", ["a"], ["a > 1"]),
        ("t", ["a"], [f"a IN ({2**63})"]),   # beyond 64 bits: SQLite compares a real
        ("w", ["b"], []), ("v", ["a"], []), ("g", ["a"], []), ("nope", ["a"], []),
    ]:
        assert plan(con, p, table, cols, where) is None, (table, cols, where)
    for side in ("-wal", "-journal"):  # pages SQLite would read from beside the file
        Path(f"{p}{side}").write_bytes(b"x")
        assert plan(con, p, "t", ["a"], []) is None
        Path(f"{p}{side}").write_bytes(b"")
        assert plan(con, p, "t", ["a"], []) is not None
    monkeypatch.setenv("STEPSCOPE_PAGE_SCAN", "0")
    assert plan(con, p, "t", ["a"], []) is None
    con.close()


def _outcome(fn):
    try:
        return fn()
    except int_scan._scan.NotIntegers:
        return "NotIntegers"
    except OverflowError:
        return "OverflowError"
    except RuntimeError as e:
        return ("RuntimeError", str(e))


_EDGES = [0, 1, -1, 127, -128, 128, 32767, -32768, 32768, 2**23 - 1, -(2**23), 2**23, 2**31 - 1, -(2**31),
          2**31, 2**47 - 1, -(2**47), 2**47, 2**63 - 1, -(2**63)]
# integers of each width SQLite stores (1, 2, 3, 4, 6, 8 bytes; 0 and 1 in none), both signs
_VALUE = st.one_of(*[st.integers(-(2 ** (b - 1)), 2 ** (b - 1) - 1) for b in (8, 16, 24, 32, 48, 64)],
                   st.sampled_from(_EDGES), st.none(), st.sampled_from([2.5, -0.0, "7", "", b"\x01"]))


def _scan_and_pages(p: Path, table: str, cols: list[str], where: list[str], lo: int, hi: int, cap: int,
                    edit=lambda plan: plan):
    """_scan.scan of the query and _scan.pages of its plan (`edit`ed: a planted mistake), each
    as its outcome: (rows, null counts, values, NULL flags) or the exception it raised."""
    with ro(p) as con:
        plan = edit(int_scan.page_plan(con, p, table, cols, where))
    assert plan is not None
    clauses = list(where) + ([f"rowid > {lo}"] if lo != int_scan.NO_LOWER else []) + [f"rowid <= {hi}"]
    sql = f"SELECT {', '.join(cols)} FROM {table} WHERE {' AND '.join(clauses)}"
    uri = p.resolve().as_uri() + "?mode=ro"
    out = []
    for fn in ("scan", "pages"):
        values = tuple(np.full(cap, 7, np.int64) for _ in cols)
        nulls = tuple(np.full(cap, 9, np.uint8) for _ in cols)
        if fn == "scan":
            got = _outcome(lambda: int_scan._scan.scan(uri, sql, values, nulls))
        else:
            got = _outcome(lambda: int_scan._scan.pages(str(p), plan.root, plan.fields, plan.filters, lo, hi,
                                                        values, nulls))
        if isinstance(got, tuple) and got[0] != "RuntimeError":
            n, counts = got
            got = (n, counts, [v[:n].tolist() for v in values],
                   [m[:n].tolist() if c else None for m, c in zip(nulls, counts)])
        out.append(got)
    return out


@examples(150, 40)
@given(rows=st.lists(st.tuples(st.integers(-(2**40), 2**40), _VALUE, _VALUE, _VALUE), max_size=300),
       page_size=st.sampled_from([512, 1024, 4096, 65536]), big=st.sets(st.integers(0, 299), max_size=2),
       ids=st.sets(st.sampled_from(_EDGES[:8]), max_size=4), filtered=st.booleans(), added=st.booleans(),
       span=st.tuples(st.integers(-(2**40), 2**40), st.integers(-(2**40), 2**40)), whole=st.booleans(),
       cap=st.integers(0, 320), order=st.permutations(["a", "b", "c", "NULL"]))
def test_pages_read_what_sqlite_returns(tmp_path_factory, rows, page_size, big, ids, filtered, added, span, whole,
                                        cap, order):
    """_scan.pages against _scan.scan (SQLite stepping the same query): any rowids (negative,
    sparse: a tree of several levels on small pages), integers of every width, NULLs, reals,
    text and blobs, a filter `a IN (...)`, any rowid span, a capacity that runs out. The same
    rows, values, NULL flags and outcome (NotIntegers, OverflowError), except that the page
    reader may stop (RuntimeError) where a row needs an overflow page or lacks a field (a
    column added after it was written): there SQLite reads the slice."""
    p = tmp_path_factory.mktemp("t") / "t.sqlite"
    stored_big = False
    with sqlite3.connect(p) as con:
        con.execute(f"PRAGMA page_size = {page_size}")
        con.execute("CREATE TABLE t (a INTEGER, b INTEGER, blob BLOB, c INTEGER)")
        seen = set()
        for i, (rowid, a, b, c) in enumerate(rows):
            if rowid in seen:
                continue
            seen.add(rowid)
            stored_big |= i in big
            con.execute("INSERT INTO t (rowid, a, b, blob, c) VALUES (?, ?, ?, ?, ?)",
                        (rowid, a, b, b"\x00" * (70_000 if i in big else 8), c))
        if added:
            con.execute("ALTER TABLE t ADD COLUMN d INTEGER")
            con.execute("INSERT INTO t (rowid, a, b, c, d) VALUES (?, 1, 2, 3, 4)", (2**41,))
    cols = list(order) + (["d"] if added else [])
    where = [f"a IN ({', '.join(map(str, sorted(ids))) or '-1'})"] if filtered else []
    lo, hi = (int_scan.WHOLE if whole else (min(span), max(span)))
    scan, pages = _scan_and_pages(p, "t", cols, where, lo, hi, cap)
    if isinstance(pages, tuple) and pages[0] == "RuntimeError":
        assert ("overflow page" in pages[1] and stored_big) or ("without a field" in pages[1] and added), pages
    else:
        assert pages == scan


def test_planted_mistakes_are_found(tmp_path):
    """The comparison above can fail: a plan one field off (b read as a), and a filter moved to
    the other field, each differ from SQLite on a small table."""
    from dataclasses import replace

    p, con = _con(tmp_path, "CREATE TABLE t (a INTEGER, b INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(1, 2), (None, 5), (3, None), (2**40, -(2**40))])
    con.commit()
    con.close()
    query = (p, "t", ["a", "b"], ["a IN (1, 3)"], *int_scan.WHOLE, 10)
    scan, pages = _scan_and_pages(*query)
    assert pages == scan == (2, (0, 1), [[1, 3], [2, 0]], [None, [0, 1]])
    for wrong in (lambda plan: replace(plan, fields=(1, 0)), lambda plan: replace(plan, filters=((1, (1, 3)),))):
        scan, pages = _scan_and_pages(*query, edit=wrong)
        assert pages != scan


def test_a_file_that_changes_while_read_is_left_to_sqlite(tmp_path):
    """The page reader compares the header's change counter and the file's size and time before
    and after: a file written meanwhile is read by SQLite. Here the time moves (os.utime, as a
    writer's commit would), checked through a read that sees it move."""
    p, con = _con(tmp_path, "CREATE TABLE t (a INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5000)])
    con.commit()
    con.close()
    with ro(p) as c:
        plan = int_scan.page_plan(c, p, "t", ["a"], [])
    v, m = (np.empty(5000, np.int64),), (np.empty(5000, np.uint8),)
    assert int_scan._scan.pages(str(p), plan.root, plan.fields, (), *int_scan.WHOLE, v, m)[0] == 5000
    import threading

    stop = threading.Event()

    def touch():
        t = 1_000_000_000
        while not stop.is_set():
            t += 1
            os.utime(p, (t, t))

    th = threading.Thread(target=touch)
    th.start()
    try:
        seen = set()
        for _ in range(200):
            try:
                int_scan._scan.pages(str(p), plan.root, plan.fields, (), *int_scan.WHOLE, v, m)
                seen.add("ok")
            except RuntimeError as e:
                seen.add(str(e))
            if "the file changed while it was read" in seen:
                break
    finally:
        stop.set()
        th.join()
    assert "the file changed while it was read" in seen


def test_table_read_falls_back_to_scan(tmp_path):
    """int_scan.Table.read with a plan: the page reader's rows; where it stops (a row on an
    overflow page), SQLite's."""
    p, con = _con(tmp_path, "CREATE TABLE t (a INTEGER, b BLOB)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, b"\x00" * (9000 if i == 3 else 1)) for i in range(10)])
    con.commit()
    con.close()
    uri = p.resolve().as_uri() + "?mode=ro"
    with ro(p) as c:
        plan = int_scan.page_plan(c, p, "t", ["a"], [])
    v, m = (np.empty(10, np.int64),), (np.empty(10, np.uint8),)
    assert int_scan._scan.pages(str(p), plan.root, plan.fields, (), int_scan.NO_LOWER, 3, v, m)[0] == 3
    with pytest.raises(RuntimeError, match="overflow page"):  # rowid 4's row does not fit its page
        int_scan._scan.pages(str(p), plan.root, plan.fields, (), *int_scan.WHOLE, v, m)
    for hi in (3, 10):
        table = int_scan.Table(["a"], [hi])
        table.read(0, uri, f"SELECT a FROM t WHERE rowid <= {hi}", plan, (int_scan.NO_LOWER, hi))
        assert table.frame()["a"].to_list() == list(range(hi))


_SRC = FIXTURES / "llama8b_decode_b1_eager.sqlite"


def _tree_pages(path: Path) -> tuple[int, list[int]]:
    with ro(path) as con:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        return size, [r[0] for r in con.execute(f"SELECT pageno FROM dbstat WHERE name IN ('{K}', '{R}') "
                                                "ORDER BY pageno")]


@examples(120, 25)
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 4095), st.integers(0, 255)), min_size=1,
                      max_size=12))
def test_damaged_tree_pages_read_as_sqlite_reads_them(tmp_path_factory, flips):
    """Bytes of the kernel and API tables' pages (cell pointers, cell headers, records, interior
    keys, child numbers) changed at random: the page reader gives the frames and warnings that
    the compiled scan (SQLite) gives, or the same error. Where it cannot tell what SQLite would
    read it stops, and SQLite reads."""
    from stepscope.errors import InputError

    size, pages = _tree_pages(_SRC)
    p = tmp_path_factory.mktemp("d") / "d.sqlite"
    data = bytearray(_SRC.read_bytes())
    for page, at, byte in flips:
        data[(pages[page % len(pages)] - 1) * size + at % size] = byte
    p.write_bytes(bytes(data))
    got = []
    with pytest.MonkeyPatch.context() as mp:
        for mode in ("pages", "scan"):
            try:
                got.append(_read(p, mode, mp))
            except InputError as e:
                got.append(str(e))
    if isinstance(got[0], str) or isinstance(got[1], str):
        assert got[0] == got[1]
    else:
        same_trace(*got)


@pytest.mark.parametrize("damage", [None, f"UPDATE {K} SET gridX = 'x' WHERE rowid = 5",
                                    f"UPDATE {K} SET globalPid = -(globalPid + 12345) WHERE rowid % 7 = 3"])
def test_launch_configuration_from_the_pages(tmp_path, monkeypatch, damage):
    """launch_config's read of chosen kernel names (phase evidence): from the pages, with the pid
    unpacked as SQLite's `(globalPid >> 24) & 16777215` does (a negative globalPid too); a grid of
    another type leaves the read to ADBC, which reads it as no grid. The same frames as ADBC's,
    and its step window (not a plain query: the compiled scan) too."""
    from stepscope.launch_config import NsysLaunchConfig

    p = mutated(tmp_path, *([damage] if damage else []), source=FIXTURES / "round5" / "llama8b_decode_b1_bare.sqlite")
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 50)  # two slices, as a big trace's
    with ro(p) as con:
        ids = [r[0] for r in con.execute(f"SELECT DISTINCT shortName FROM {K} WHERE rowid <= 5")]
        lo, hi = con.execute(f"SELECT min(start), (min(start) + max(start)) / 2 FROM {K}").fetchone()
        pids = sorted({r[0] for r in con.execute(f"SELECT (globalPid >> 24) & 16777215 FROM {K} WHERE shortName IN "
                                                 f"({','.join(map(str, ids))}) AND typeof(gridX) = 'integer'")})
    got = {}
    for mode in ("pages", "adbc"):
        calls: list = []
        monkeypatch.setenv("STEPSCOPE_NATIVE_SCAN", "0" if mode == "adbc" else "1")
        monkeypatch.setenv("STEPSCOPE_PAGE_SCAN", "1" if mode == "pages" else "0")
        real = int_scan._scan.pages
        monkeypatch.setattr(int_scan._scan, "pages", lambda *a: calls.append(a[1]) or real(*a))
        reader = NsysLaunchConfig(p)
        got[mode] = (reader(ids), reader.window([0], lo, hi), reader.window([0], lo, hi, narrow=False))
        # the two slices of the by-name read (after a damaged one, the other may not have begun)
        n = calls.count(_root(p, K))
        assert n == 0 if mode == "adbc" else n == 2 if damage is None else n >= 1
    for a, b in zip(got["pages"], got["adbc"]):
        assert a.equals(b) and a.schema == b.schema
    assert sorted(set(got["pages"][0]["pid"].to_list())) == pids


def test_the_rowid_as_a_field(tmp_path):
    """Field -2 is the row's rowid, as `SELECT rowid` (sparse and negative rowids too)."""
    p, con = _con(tmp_path, "CREATE TABLE t (a INTEGER)")
    con.executemany("INSERT INTO t (rowid, a) VALUES (?, ?)", [(-7, 1), (3, None), (2**40, 5)])
    con.commit()
    con.close()
    with ro(p) as c:
        root = _root(p, "t")
        want = c.execute("SELECT rowid, a FROM t").fetchall()
    v, m = (np.empty(3, np.int64), np.empty(3, np.int64)), (np.empty(3, np.uint8), np.empty(3, np.uint8))
    assert int_scan._scan.pages(str(p), root, (-2, 0), (), *int_scan.WHOLE, v, m) == (3, (0, 1))
    assert list(zip(v[0].tolist(), [None if f else x for x, f in zip(v[1].tolist(), m[1].tolist())])) == want
