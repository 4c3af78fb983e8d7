"""The compiled reader of queries that select integers only (`_scan.c`): the kernel and API
tables, which are most of what a big export's read costs.

It reads the same rows ADBC would, into arrays allocated here, and hands back a frame of Int64
columns (NULL kept as null). Where the query is a plain one of a rowid table (`page_plan`), the
rows come straight from the table's B-tree pages in the file (`_scan.pages`), which skips
SQLite's virtual machine; where the pages hold something it does not read as SQLite would (an
overflow page, a damaged page), SQLite reads the slice. `NotIntegers` when a value of another
SQLite type is met: the reader then runs the table's typed query (typed.py) as it does after ADBC. Any other failure
(SQLite's error, more rows than the slice can hold) is for the ADBC path to read and report,
so an error reads the same with or without this module. Without the compiled module (no C
compiler when stepscope was installed), or with STEPSCOPE_NATIVE_SCAN=0, `available()` is
False and ADBC reads every table.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

try:
    import stepscope.ingest._scan as _scan  # the module, not the package: no circle through ingest/__init__
except ImportError:  # built without a compiler or SQLite's header (setup.py: optional)
    _scan = None


class NotIntegers(Exception):
    """The query met a value that is neither an integer nor NULL."""


class Unread(Exception):
    """The query could not be read here (SQLite's error, too many rows): the ADBC path reads it."""


def available() -> bool:
    return _scan is not None and os.environ.get("STEPSCOPE_NATIVE_SCAN", "1") != "0"


NO_LOWER = -(1 << 63)  # a span's lower bound that bounds nothing
WHOLE = (NO_LOWER, (1 << 63) - 1)  # (lo, hi]: every rowid


@dataclass(frozen=True)
class Pages:
    """Where a query's rows lie in the export's own pages, for `_scan.pages`: the table's root
    page, the record field of each selected column (-1: NULL), and its `col IN (...)` filters as
    (field, ids). Reading the B-tree's pages directly skips SQLite's virtual machine, which is
    most of what stepping rows costs (docs/PERFORMANCE.md, round six)."""

    path: str
    root: int
    fields: tuple[int, ...]
    filters: tuple[tuple[int, tuple[int, ...]], ...]


_NAME = r"[A-Za-z_][A-Za-z0-9_]*"  # a bare column name (`123` would be a number)
_IN = re.compile(rf"\s*({_NAME})\s+IN\s*\(\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\)\s*", re.IGNORECASE)
_WITHOUT_ROWID = re.compile(r"\)\s*WITHOUT\s+ROWID", re.IGNORECASE)


def page_plan(con, path: Path | str, table: str, cols: list[str], where: list[str]) -> Pages | None:
    """The page reader's plan for `SELECT cols FROM table WHERE where`, or None where only SQLite
    can read it exactly: page reading off (STEPSCOPE_PAGE_SCAN=0), an export with a journal or
    write-ahead log beside it (SQLite would read pages from there), a view, a virtual or WITHOUT
    ROWID table, generated columns, a column that is the rowid's alias, an expression, a filter
    other than `column IN (integers)` on a column of INTEGER affinity. `con`: a sqlite3
    connection to the export (the catalog is read through it)."""
    if not available() or os.environ.get("STEPSCOPE_PAGE_SCAN", "1") == "0":
        return None
    for side in ("-wal", "-journal"):
        try:
            if os.path.getsize(f"{path}{side}") > 0:
                return None
        except OSError:
            pass
    row = con.execute("SELECT type, rootpage, sql FROM sqlite_master WHERE type = 'table' AND name = ? "
                      "COLLATE NOCASE", (table,)).fetchall()
    if len(row) != 1:
        return None
    _, root, sql = row[0]
    if not isinstance(root, int) or root < 2 or not isinstance(sql, str) or _WITHOUT_ROWID.search(sql):
        return None  # a virtual table's root page is 0
    info = con.execute(f"PRAGMA table_xinfo('{table}')").fetchall()  # cid, name, type, notnull, default, pk, hidden
    if any(r[6] for r in info):  # generated columns are not stored as the others are
        return None
    by_name = {r[1].lower(): (field, r) for field, r in enumerate(info) if isinstance(r[1], str)}

    def field(name: str, integer: bool = False) -> int | None:
        got = by_name.get(name.lower())
        if got is None or got[1][5]:  # a primary key column may be the rowid itself
            return None
        if integer and "INT" not in str(got[1][2]).upper():  # not INTEGER affinity: IN compares otherwise
            return None
        return got[0]

    fields = []
    for c in cols:
        f = -1 if c.upper() == "NULL" else field(c) if re.fullmatch(_NAME, c) else None
        if f is None:
            return None
        fields.append(f)
    filters = []
    for clause in where:
        m = _IN.fullmatch(clause)
        f = field(m.group(1), integer=True) if m else None
        if f is None:
            return None
        ids = {int(v) for v in m.group(2).split(",")}
        if not all(-(1 << 63) <= v < (1 << 63) for v in ids):  # SQLite would compare a real number
            return None
        filters.append((f, tuple(sorted(ids))))
    if len(filters) > 8 or max(fields + [f for f, _ in filters]) >= 2000:
        return None
    return Pages(str(path), root, tuple(fields), tuple(filters))


class Table:
    """One table read in rowid slices (each on a thread of its own) straight into one array per
    column: slice i writes from its offset, and `frame()` moves the slices together (a slice of
    a filtered query holds fewer rows than its range). No slice is copied to be concatenated."""

    def __init__(self, names: list[str], capacities: list[int]) -> None:
        import numpy as np

        self.names = names
        self.offsets = [0]
        for cap in capacities:
            self.offsets.append(self.offsets[-1] + cap)
        # np.empty leaves the pages untouched: the rows a slice does not fill cost nothing, and
        # a column without NULL never touches its null flags
        try:
            self.values = [np.empty(self.offsets[-1], np.int64) for _ in names]
            self.nulls = [np.empty(self.offsets[-1], np.uint8) for _ in names]
        except (MemoryError, ValueError) as e:  # more address space than this machine lends
            raise Unread(f"{self.offsets[-1]:,} rows: {e}") from None
        self.rows = [0] * len(capacities)
        self.null_counts: list[tuple[int, ...]] = [(0,) * len(names)] * len(capacities)

    def read(self, i: int, uri: str, sql: str, pages: Pages | None = None,
             span: tuple[int, int] = WHOLE) -> None:
        """Slice i: `sql`'s rows, at most the slice's capacity. With `pages` (the same query's
        plan, its rowids `span`: (lo, hi]) from the export's pages, unless the page reader finds
        what it leaves to SQLite (an overflow page, a damaged page, a writer): then as without."""
        a, b = self.offsets[i], self.offsets[i + 1]
        values, nulls = tuple(v[a:b] for v in self.values), tuple(m[a:b] for m in self.nulls)
        try:
            if pages is not None:
                try:
                    self.rows[i], self.null_counts[i] = _scan.pages(
                        pages.path, pages.root, pages.fields, pages.filters, span[0], span[1], values, nulls)
                    return
                except RuntimeError:
                    pass
            self.rows[i], self.null_counts[i] = _scan.scan(uri, sql, values, nulls)
        except _scan.NotIntegers:
            raise NotIntegers(sql) from None
        except (RuntimeError, OverflowError, ValueError) as e:
            raise Unread(str(e)) from None

    def frame(self) -> pl.DataFrame:
        """The slices' rows in slice order, as Int64 columns (NULL as null)."""
        import numpy as np

        n = 0
        with_nulls = [any(c[j] for c in self.null_counts) for j in range(len(self.names))]
        for i, rows in enumerate(self.rows):
            a = self.offsets[i]
            for j, (v, m) in enumerate(zip(self.values, self.nulls)):
                if with_nulls[j] and not self.null_counts[i][j]:
                    m[a:a + rows] = 0  # flags this slice never wrote: it met no NULL there
                if a != n:
                    v[n:n + rows] = v[a:a + rows]
                    if with_nulls[j]:
                        m[n:n + rows] = m[a:a + rows]
            n += rows
        cols = []
        for name, v, m, nulls in zip(self.names, self.values, self.nulls, with_nulls):
            s = pl.Series(name, v[:n])  # no copy: polars takes numpy's buffer
            if nulls:
                s = pl.select(pl.when(pl.Series(m[:n].view(np.bool_))).then(None).otherwise(s)).to_series()
            cols.append(s.alias(name))
        return pl.DataFrame(cols)
