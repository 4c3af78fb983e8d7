"""Frame helpers shared by the analyses: sorting that skips work nsys already did, and maps
from small integer ids done by a lookup table.

nsys writes its activity tables in start order, so most sorts the analyses need find their
input already in order; checking is one vectorized pass, sorting a million rows is several.
"""

from __future__ import annotations

import polars as pl

_NULL_LAST = (1 << 63) - 1  # stands for null in a nulls-last order check


def is_sorted_by(df: pl.DataFrame, by: list[str]) -> bool:
    """Whether df's rows are in ascending lexicographic order of `by` (nulls last)."""
    if df.height < 2:
        return True
    if len(by) == 1 and df[by[0]].null_count() == 0:
        return df[by[0]].is_sorted()
    before = pl.lit(False)  # an earlier column already orders the pair
    tied = pl.lit(True)     # all columns so far are equal
    for c in by:
        x = pl.col(c).fill_null(_NULL_LAST)
        prev = x.shift(1)
        before = before | (tied & (prev < x))
        tied = tied & (prev == x)
    return bool(df.select((before | tied).slice(1).all()).item())


def sorted_by(df: pl.DataFrame, *by: str, consume: bool = False) -> pl.DataFrame:
    """df sorted ascending by `by` (nulls last, stable), without sorting when it already is.

    `consume=True` (the caller holds the only reference to df and never reads it again): the
    sorted frame is built four columns at a time, each source column released once copied, so
    the sort holds four columns twice rather than the whole frame (a million-row activity frame
    is ~100 MB). df is left without columns when it had to be sorted."""
    cols = list(by)
    if is_sorted_by(df, cols):
        return df
    if len(cols) > 1 and is_sorted_by(df, cols[1:]):
        # already in order of the later keys (e.g. start order, with steps interleaved across
        # devices): a stable sort on the first key alone gives the full order, far cheaper
        cols = cols[:1]
    if not consume:
        return df.sort(cols, nulls_last=True, maintain_order=True)
    order = df.select(pl.arg_sort_by(cols, nulls_last=True, maintain_order=True)).to_series()
    names, parts = df.columns, []
    for i in range(0, len(names), 4):  # four columns per gather: polars still copies them in parallel
        part = pl.DataFrame([df.drop_in_place(n) for n in names[i:i + 4]])
        parts.append(part.select(pl.all().gather(order)))  # (DataFrame.gather is polars 2 only)
        del part
    return pl.concat(parts, how="horizontal")


def lookup(col: str, keys: pl.Series, values: pl.Series) -> pl.Expr:
    """`col` mapped through keys -> values, for small non-negative integer keys (string ids,
    window numbers): one gather from a table indexed by key instead of a hash lookup per row.
    A value of `col` that is not among `keys` (or out of the table's range) maps to null."""
    size = int(keys.max()) + 1 if keys.len() else 1  # no keys: a one-slot table of null
    if size > max(4 * keys.len(), 1 << 20):
        # sparse keys (a damaged export's string id near 2^31): the table would take gigabytes
        return pl.col(col).replace_strict(keys, values, default=None, return_dtype=values.dtype)
    table = pl.repeat(None, size, dtype=values.dtype, eager=True)
    if keys.len():
        table = table.scatter(keys.cast(pl.Int64), values)
    c = pl.col(col)
    inside = (c >= 0) & (c < size)
    return pl.when(inside).then(pl.lit(table).gather(c.clip(0, size - 1)))
