"""The compiled reader of queries that select integers only (`_scan.c`): the kernel and API
tables, which are most of what a big export's read costs.

It reads the same rows ADBC would, into arrays allocated here, and hands back a frame of Int64
columns (NULL kept as null). `NotIntegers` when a value of another SQLite type is met: the
reader then runs the table's typed query (typed.py) as it does after ADBC. Any other failure
(SQLite's error, more rows than the slice can hold) is for the ADBC path to read and report,
so an error reads the same with or without this module. Without the compiled module (no C
compiler when stepscope was installed), or with STEPSCOPE_NATIVE_SCAN=0, `available()` is
False and ADBC reads every table.
"""

from __future__ import annotations

import os

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

    def read(self, i: int, uri: str, sql: str) -> None:
        """Slice i: `sql`'s rows, at most the slice's capacity."""
        a, b = self.offsets[i], self.offsets[i + 1]
        try:
            self.rows[i], self.null_counts[i] = _scan.scan(
                uri, sql, tuple(v[a:b] for v in self.values), tuple(m[a:b] for m in self.nulls))
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
