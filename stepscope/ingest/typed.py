"""Typed reads: one SQLite query into a frame of the model's dtypes, whatever the file holds.

SQLite keeps any value in any column. An export that was damaged, edited or written by another
tool can hold TEXT, BLOB or REAL where nsys writes integers, integers beyond the 32 bits the
model keeps ids in, NULL in a column nsys never leaves empty, or bytes that are not UTF-8 in a
name. A row holding such a value where stepscope reads it is left out and counted per table
and column (`Reading.warning`); a name that is not UTF-8 is kept with U+FFFD for the bad bytes
and counted. Nothing is cast into a wrong value, and nothing reaches polars that could make it
panic (invalid UTF-8 in a String column).

On a clean export the checks cost a pass over a few columns: the plain query runs, and the
dtypes that came back are checked (ADBC types each column from the values it reads, and stops
at a later value of another type). Only when a column came back of another type is the query
run again with each value's SQLite type tested in SQL, which reads about 2.5x slower.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import polars as pl

INT, INT32, TEXT = "int", "int32", "text"
_I32 = (-(1 << 31), (1 << 31) - 1)
_WRONG = "_wrong_type"  # bit i set: the i-th integer column held a value of another SQLite type


@dataclass(frozen=True)
class Col:
    name: str             # the frame's column
    sql: str              # the expression selected (a column, or NULL for one the file lacks)
    kind: str = INT       # INT (64-bit), INT32 (ids, devices, streams) or TEXT
    required: bool = True  # NULL leaves the row out (nsys writes these columns NOT NULL)
    source: str = ""      # the file's column, for messages (default: sql)

    @property
    def label(self) -> str:
        return self.source or self.sql


@dataclass
class Query:
    table: str                       # named in warnings; the FROM clause unless `from_` is given
    cols: list[Col]
    where: list[str] = field(default_factory=list)
    from_: str | None = None

    def _select(self, typed: bool) -> list[str]:
        out = []
        for c in self.cols:
            if c.kind == TEXT:
                # as bytes, validated by polars: ADBC hands polars its text unvalidated, and
                # invalid UTF-8 in a String column made it panic. coalesce: a column whose
                # first batch is all NULL would be typed INT64 by ADBC, and later text refused
                out.append(f"coalesce(CAST({c.sql} AS BLOB), x'')")
                out.append(f"({c.sql} IS NULL)")
            elif typed:
                out.append(f"CASE WHEN typeof({c.sql}) = 'integer' THEN {c.sql} END")
            else:
                out.append(c.sql)
        if typed:
            bits = [f"((typeof({c.sql}) NOT IN ('integer', 'null')) << {i})" for i, c in enumerate(self.ints)]
            out.append(" | ".join(bits) or "0")
        return out

    def sql(self, typed: bool, extra: list[str] | None = None) -> str:
        clauses = list(self.where) + list(extra or [])
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        return f"SELECT {', '.join(self._select(typed))} FROM {self.from_ or self.table}{where}"

    @property
    def ints(self) -> list[Col]:
        return [c for c in self.cols if c.kind != TEXT]

    def raw_names(self, typed: bool) -> list[str]:
        names = []
        for c in self.cols:
            names.append(c.name)
            if c.kind == TEXT:
                names.append(f"_null_{c.name}")
        return names + ([_WRONG] if typed else [])

    def raw_schema(self, typed: bool) -> dict:
        """Names and dtypes of what a read returns, by position."""
        dt = {INT: pl.Int64, INT32: pl.Int64, TEXT: pl.Binary}
        out = {}
        for c in self.cols:
            out[c.name] = dt[c.kind]
            if c.kind == TEXT:
                out[f"_null_{c.name}"] = pl.Int64
        if typed:
            out[_WRONG] = pl.Int64
        return out


def fits(df: pl.DataFrame, q: Query, typed: bool) -> bool:
    """Whether a plain read came back with the dtypes it must have: integers (or all-NULL
    columns) where integers were selected, bytes for text. A column ADBC typed as text or
    float holds a value of another type: the typed query is needed."""
    if df.width != len(q.raw_names(typed)):
        return False
    if df.height == 0:  # no values, so none of a wrong type (ADBC types an empty result its own way)
        return True
    for (name, want), have in zip(q.raw_schema(typed).items(), df.dtypes):
        if have == pl.Null:
            continue
        if want == pl.Binary and have != pl.Binary:
            return False
        if want == pl.Int64 and not have.is_integer():
            return False
    return True


@dataclass
class Reading:
    """What was left out of one table's read, and why."""

    table: str
    rows: int = 0            # rows read (before any was left out)
    left_out: int = 0
    why: Counter = field(default_factory=Counter)   # (column, reason) -> rows
    bad_text: Counter = field(default_factory=Counter)  # column -> names with bytes not UTF-8

    def add(self, other: "Reading") -> None:
        self.rows += other.rows
        self.left_out += other.left_out
        self.why.update(other.why)
        self.bad_text.update(other.bad_text)

    def warning(self) -> str | None:
        parts = []
        if self.left_out:
            reasons = ", ".join(f"{col} {why} in {n:,}" for (col, why), n in sorted(self.why.items()))
            parts.append(f"{self.left_out:,} of {self.rows:,} rows left out ({reasons})")
        for col, n in sorted(self.bad_text.items()):
            parts.append(f"{col} is not UTF-8 in {n:,} rows (read with U+FFFD for the bad bytes)")
        return f"{self.table}: {'; '.join(parts)}" if parts else None


def clean(df: pl.DataFrame, q: Query, typed: bool) -> tuple[pl.DataFrame, Reading]:
    """A raw read (plain or typed) → the frame with the columns' model dtypes, the rows that
    hold a wrong value left out, and the account of them."""
    df.columns = q.raw_names(typed)
    if df.height == 0:
        df = pl.DataFrame(schema=q.raw_schema(typed))
    rep = Reading(q.table, rows=df.height)
    checks: dict[tuple[str, str], pl.Expr] = {}
    if typed:
        for i, c in enumerate(q.ints):
            checks[(c.label, "not an integer")] = ((pl.col(_WRONG) // (1 << i)) % 2) == 1
    wrong = pl.col(_WRONG) != 0 if typed else pl.lit(False)
    for c in q.cols:
        if c.required and c.kind == TEXT and (df[f"_null_{c.name}"] == 1).any():
            checks[(c.label, "NULL")] = pl.col(f"_null_{c.name}") == 1
        elif c.required and c.kind != TEXT and df[c.name].null_count():
            checks[(c.label, "NULL")] = pl.col(c.name).is_null() & ~wrong
        if c.kind == INT32 and df.height and df[c.name].null_count() < df.height:
            lo, hi = df[c.name].min(), df[c.name].max()
            if lo < _I32[0] or hi > _I32[1]:
                checks[(c.label, "beyond 32 bits")] = (pl.col(c.name) < _I32[0]) | (pl.col(c.name) > _I32[1])
    if checks:
        counts = df.select(**{f"_{i}": e.sum() for i, e in enumerate(checks.values())}).row(0)
        drop = pl.lit(False)
        for (key, expr), n in zip(checks.items(), counts):
            if n:
                rep.why[key] += n
                drop = drop | expr.fill_null(False)
        if rep.why:
            kept = df.filter(~drop)
            rep.left_out = df.height - kept.height
            df = kept
    out = []
    for c in q.cols:
        if c.kind == TEXT:
            text, bad = decode(df[c.name])
            if bad:
                rep.bad_text[c.label] += bad
            if not c.required and (df[f"_null_{c.name}"] == 1).any():
                text = pl.select(pl.when(df[f"_null_{c.name}"] == 1).then(None).otherwise(text)).to_series()
            out.append(text.alias(c.name))
        else:
            out.append(df[c.name].cast(pl.Int32 if c.kind == INT32 else pl.Int64).alias(c.name))
    return pl.DataFrame(out) if out else df.clear(), rep


def decode(raw: pl.Series) -> tuple[pl.Series, int]:
    """Bytes → text, validated by polars; on bytes that are not UTF-8, decoded one by one with
    U+FFFD for the bad bytes, and counted."""
    if raw.dtype == pl.Null:
        return raw.cast(pl.String), 0
    try:
        return raw.cast(pl.String), 0
    except pl.exceptions.PolarsError:
        pass
    bad = 0
    values = []
    for b in raw.to_list():  # only for a damaged column: a clean one took the cast above
        if b is None:
            values.append(None)
            continue
        try:
            values.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            bad += 1
            values.append(b.decode("utf-8", "replace"))
    return pl.Series(raw.name, values, dtype=pl.String), bad
