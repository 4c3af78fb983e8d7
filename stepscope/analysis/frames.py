"""Frame helpers shared by the analyses: sorting that skips work nsys already did, maps from
small integer ids done by a lookup table, and group-bys and joins on one packed integer key.

nsys writes its activity tables in start order, so most sorts the analyses need find their
input already in order; checking is one vectorized pass, sorting a million rows is several.
"""

from __future__ import annotations

from dataclasses import dataclass

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


# --- packed keys ------------------------------------------------------------------------------
# polars groups and joins one int64 column several times faster than the same rows keyed by two
# to four columns (a million activities by step, name, demangled name and class: 4-6x). Packing
# is exact only while every column's range fits its share of the 62 bits; the helpers below
# measure the ranges, pack when they fit and fall back to the plain group-by or join otherwise,
# so no analysis carries bit widths of its own (tests/test_frames.py checks both paths against
# polars' plain group_by / join).

KEY_BITS = 62  # a packed key stays a non-negative int64
FAR_END = 1 << KEY_BITS  # a time after every event: the end of a range that never closed


def fits_packed(span: int, groups: int) -> bool:
    """Whether `groups` runs of values spanning `span` each, lifted one above the other, stay
    within a packed key's bits (the arrays' per-group accumulate)."""
    return span * (groups + 2) < FAR_END


def pack_pair(groups, times, base: int, width: int):
    """numpy int64 keys (group, time − base): the group above the time's `width` bits (the
    caller checked that both fit KEY_BITS)."""
    import numpy as np

    key = groups.astype(np.int64) << width
    key += times - base
    return key


def small_ids(lo: int, hi: int) -> bool:
    """Whether ids from `lo` to `hi` can index a lookup table (24 bits: string ids of an export)."""
    return 0 <= lo and hi < (1 << 24)


@dataclass(frozen=True)
class Packing:
    """How columns pack into one int64: each value less its column's low, `bits` wide."""

    cols: tuple[str, ...]
    lows: tuple[int, ...]
    bits: tuple[int, ...]

    def expr(self, alias: str = "_k") -> pl.Expr:
        key = pl.lit(0, pl.Int64)
        for c, lo, b in zip(self.cols, self.lows, self.bits):
            key = key * (1 << b) + (_physical(c) - lo)
        return key.alias(alias)

    def unpacked(self, key: str = "_k") -> list[pl.Expr]:
        """The integer columns back from the key (the caller casts them)."""
        out, div = [], 1
        for c, lo, b in reversed(list(zip(self.cols, self.lows, self.bits))):
            out.append(((pl.col(key) // div) % (1 << b) + lo).alias(c))
            div <<= b
        return out[::-1]


def _physical(col: str) -> pl.Expr:
    return pl.col(col).to_physical().cast(pl.Int64)


def packing(frames: list[pl.DataFrame], cols: list[str], nulls: bool = False) -> Packing | None:
    """The packing of `cols` over every frame of `frames`, or None when their ranges do not fit
    KEY_BITS (or, unless `nulls`, a column holds a null: a group-by would merge null keys)."""
    lows, highs = [None] * len(cols), [None] * len(cols)
    for f in frames:
        if not f.height:
            continue
        if not nulls and any(f[c].null_count() for c in cols):
            return None
        r = f.select([_physical(c).min().alias(f"lo{i}") for i, c in enumerate(cols)]
                     + [_physical(c).max().alias(f"hi{i}") for i, c in enumerate(cols)]).row(0)
        for i in range(len(cols)):
            lo, hi = r[i], r[len(cols) + i]
            if lo is not None:
                lows[i] = lo if lows[i] is None else min(lows[i], lo)
                highs[i] = hi if highs[i] is None else max(highs[i], hi)
    lows = [lo or 0 for lo in lows]
    bits = [max(int((hi if hi is not None else lo) - lo).bit_length(), 1) for lo, hi in zip(lows, highs)]
    return Packing(tuple(cols), tuple(lows), tuple(bits)) if sum(bits) <= KEY_BITS else None


def group_by_packed(df: pl.DataFrame, by: list[str], *aggs: pl.Expr) -> pl.DataFrame:
    """`df.group_by(by).agg(*aggs)` (columns `by`, then the aggregates, rows in no set order),
    grouped on one packed integer key when `by`'s ranges fit. Integer `by` columns come back
    from the key, the others (Enum, Categorical) as each group's first value."""
    p = packing([df], by)
    if p is None:
        return df.group_by(by).agg(*aggs)
    ints = [c for c in by if df.schema[c].is_integer()]
    others = [c for c in by if c not in ints]
    t = df.group_by(p.expr()).agg(*[pl.col(c).first() for c in others], *aggs)
    back = {e.meta.output_name(): e for e in p.unpacked()}
    return t.with_columns([back[c].cast(df.schema[c]) for c in ints]).select(
        *by, *[c for c in t.columns if c not in by and c != "_k"])


def join_key(left: pl.DataFrame, right: pl.DataFrame, on: list[str], alias: str = "_key") -> pl.Expr | None:
    """One int64 key standing for the columns `on` in both frames (a null in any of them makes a
    null key, which matches nothing, as in a join on the columns), or None when their ranges do
    not fit: join on the columns then."""
    p = packing([left, right], on, nulls=True)
    return None if p is None else p.expr(alias)
