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
    from stepscope.ingest import _scan
except ImportError:  # built without a compiler or SQLite's header (setup.py: optional)
    _scan = None


class NotIntegers(Exception):
    """The query met a value that is neither an integer nor NULL."""


class Unread(Exception):
    """The query could not be read here (SQLite's error, too many rows): the ADBC path reads it."""


def available() -> bool:
    return _scan is not None and os.environ.get("STEPSCOPE_NATIVE_SCAN", "1") != "0"


def frame(uri: str, sql: str, names: list[str], capacity: int) -> pl.DataFrame:
    """`sql`'s rows (at most `capacity`) as Int64 columns named `names`."""
    import numpy as np

    # np.empty leaves the pages untouched: a slice's rows bound by its rowid range cost only
    # the rows read, and a column without NULL never touches its null flags
    values = tuple(np.empty(capacity, np.int64) for _ in names)
    nulls = tuple(np.empty(capacity, np.uint8) for _ in names)
    try:
        rows, null_counts = _scan.scan(uri, sql, values, nulls)
    except TypeError:
        raise NotIntegers(sql) from None
    except (RuntimeError, OverflowError, ValueError) as e:
        raise Unread(str(e)) from None
    cols = []
    for name, v, m, n in zip(names, values, nulls, null_counts):
        s = pl.Series(name, v[:rows])
        if n:
            s = pl.select(pl.when(pl.Series(m[:rows].view(np.bool_))).then(None).otherwise(s)).to_series().alias(name)
        cols.append(s)
    return pl.DataFrame(cols)
