"""The order shortcuts of the data path: sorts skipped when nsys already wrote a table in start
order, and windows found by runs of start-sorted calls. Each shortcut is checked against the
general path it skips: polars' own sort, and the same export with its rows shuffled."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3

import polars as pl
import pytest

from stepscope.analysis.frames import is_sorted_by, sorted_by
from stepscope.analysis.steps import api_flags, find_windows, window_of
from stepscope.ingest import read_trace
from tests.conftest import FIXTURES, need, ro
from tests.golden.regen import analyze, canonical, golden_path


def test_sorted_by_agrees_with_polars_sort_on_every_small_frame():
    rnd = random.Random(7)
    for _ in range(400):
        n = rnd.randint(0, 9)
        df = pl.DataFrame({"a": [rnd.choice([None, 1, 2, 3]) for _ in range(n)],
                           "b": [rnd.randint(0, 2) for _ in range(n)]}, schema={"a": pl.Int64, "b": pl.Int64})
        want = df.sort("a", "b", nulls_last=True, maintain_order=True)
        assert sorted_by(df, "a", "b").equals(want)
        assert sorted_by(df.sort("b", maintain_order=True), "a", "b").equals(want)  # the stable shortcut
        assert is_sorted_by(df, ["a", "b"]) == df.equals(want)
        # consume=True: the same rows (every column, in order) from a column-at-a-time gather,
        # the input handed over (emptied when it had to be sorted)
        wide = df.with_columns(c=pl.int_range(pl.len()), d=pl.col("a").cast(pl.String),
                               e=pl.col("b") > 0, f=pl.col("a").cast(pl.String).cast(pl.Categorical))
        want_wide = wide.sort("a", "b", nulls_last=True, maintain_order=True)
        given = wide.clone()
        got = sorted_by(given, "a", "b", consume=True)
        assert got.equals(want_wide) and got.schema == wide.schema
        assert given.width == (wide.width if wide.equals(want_wide) else 0)
        assert is_sorted_by(df, ["a"]) == df.equals(df.sort("a", nulls_last=True, maintain_order=True))


@pytest.mark.parametrize("name", ["llama8b_decode_b1_eager.sqlite", "llama8b_decode_b1_eager_tp2.sqlite"])
def test_window_of_counts_calls_like_plain_sql(name):
    """Launch calls per NVTX step range: the binary-search runs against a SQL range join."""
    path = need(FIXTURES / name)
    trace = read_trace(path, cache=False)
    api = api_flags(trace.api, trace.string_map())
    windows = find_windows(trace, api)
    got = (api.with_columns(window_of(api, windows)).filter(pl.col("is_launch") & pl.col("window").is_not_null())
           .join(windows, on="window").group_by("w_start").len().sort("w_start"))
    want = ro(path).execute("""
        SELECT n.start, count(*) FROM NVTX_EVENTS n
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.globalTid = n.globalTid AND r.start BETWEEN n.start AND n.end
        JOIN StringIds s ON s.id = r.nameId
        WHERE n.eventType = 59 AND n.text LIKE 'step%' AND (s.value LIKE 'cudaLaunch%' OR s.value LIKE 'cuLaunch%')
        GROUP BY n.start ORDER BY n.start""").fetchall()
    assert want and got.rows() == want


def test_window_of_unsorted_calls_give_the_same_windows():
    path = need(FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite")
    trace = read_trace(path, cache=False)
    api = api_flags(trace.api, trace.string_map())
    windows = find_windows(trace, api)
    assert api["start"].is_sorted()
    shuffled = api.sample(fraction=1.0, shuffle=True, seed=3)
    assert not shuffled["start"].is_sorted()
    key = ["pid", "corr"]
    a = api.select(*key, window_of(api, windows)).sort(key)
    b = shuffled.select(*key, window_of(shuffled, windows)).sort(key)
    assert a.equals(b) and a["window"].null_count() < a.height


@pytest.mark.parametrize("name", ["llama8b_decode_b1_eager", "llama8b_decode_b1_eager_tp2", "llama8b_decode_b1_graph"])
def test_shuffled_export_analyzes_like_the_original(tmp_path, name):
    """The same export with its kernel, memset and runtime rows in random order takes every
    general path (sorts, per-call window search) and must give the stored golden document."""
    path = tmp_path / f"{name}.sqlite"
    shutil.copy(need(FIXTURES / f"{name}.sqlite"), path)
    con = sqlite3.connect(path)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
            con.execute(f"CREATE TABLE shuffled AS SELECT * FROM {table} ORDER BY random()")
            con.execute(f"DELETE FROM {table}")
            con.execute(f"INSERT INTO {table} SELECT * FROM shuffled")
            con.execute("DROP TABLE shuffled")
    con.commit()
    first = con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid LIMIT 50").fetchall()
    con.close()
    assert first != sorted(first)  # the rows really are out of order
    got = canonical(analyze(path))
    want = json.loads(golden_path(FIXTURES / f"{name}.sqlite").read_text())
    assert got == want


@pytest.mark.parametrize("name", ["llama8b_decode_b1_eager_tp2.sqlite", "llama8b_prefill_b1_eager.sqlite"])
def test_packed_class_tables_match_a_plain_group_by(name):
    """classes and kernels are grouped on packed integer keys: against polars' own group-by on
    the string columns of the same activities."""
    from stepscope.api import open_trace

    inv = open_trace(need(FIXTURES / name)).inventory
    a = inv.acts.filter(pl.col("step").is_not_null()).with_columns(pl.col("name", "demangled", "class").cast(pl.String))
    agg = (pl.len().cast(pl.Int64).alias("count"), (pl.col("end") - pl.col("start")).sum().alias("time_ns"))
    want_k = a.group_by("step", "name", "demangled", "class").agg(*agg).sort("step", "name", "demangled", "class")
    want_c = a.group_by("step", "class").agg(*agg).sort("step", "class")
    assert inv.kernels.drop("class_by").sort("step", "name", "demangled", "class").equals(want_k)
    assert inv.classes.sort("step", "class").equals(want_c)
    assert want_k.height >= 12


def test_lookup_maps_known_ids_and_nulls_the_rest():
    from stepscope.analysis.frames import lookup

    df = pl.DataFrame({"id": [3, 0, 7, None, 3, -1]}, schema={"id": pl.Int64})
    keys = pl.Series([0, 3], dtype=pl.Int64)
    got = df.select(lookup("id", keys, pl.Series([10, 30], dtype=pl.Int64))).to_series().to_list()
    assert got == [30, 10, None, None, 30, None]  # 7 is past the table, -1 before it
    none = df.select(lookup("id", keys.clear(), pl.Series([], dtype=pl.Int64))).to_series()
    assert none.null_count() == df.height


def _frame(rnd, n, wide: bool) -> pl.DataFrame:
    big = 1 << 40 if wide else 5  # wide: three columns of 40 bits do not fit one key
    kinds = pl.Enum(["host_bound", "sync", "device_side"])
    return pl.DataFrame({
        "a": [rnd.randint(-big, big) for _ in range(n)],
        "b": [rnd.randint(0, 3) for _ in range(n)],
        "c": [rnd.randint(-big, big) for _ in range(n)],
        "d": [rnd.randint(-big, big) for _ in range(n)],
        "k": [rnd.choice(["host_bound", "sync", "device_side"]) for _ in range(n)],
        "s": [rnd.choice(["gemm", "norm", "rope"]) for _ in range(n)],
        "v": [rnd.randint(0, 100) for _ in range(n)],
    }, schema={"a": pl.Int64, "b": pl.Int32, "c": pl.Int64, "d": pl.Int64, "k": kinds, "s": pl.String,
               "v": pl.Int64}).with_columns(pl.col("s").cast(pl.Categorical))


@pytest.mark.parametrize("wide", [False, True])
def test_group_by_packed_agrees_with_a_plain_group_by(wide):
    """The packed path (and, for ranges past 62 bits, the fallback) against polars' own group-by:
    integer keys negative and wide, Enum and Categorical keys, an empty frame."""
    from stepscope.analysis.frames import group_by_packed, packing

    rnd = random.Random(11)
    for n in (0, 1, 7, 300):
        df = _frame(rnd, n, wide)
        for by in (["a"], ["a", "b"], ["b", "k"], ["a", "s", "k"], ["a", "c", "d"]):
            aggs = (pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("v"))
            got = group_by_packed(df, by, *aggs)
            want = df.group_by(by).agg(*aggs)
            order = [pl.col(c).cast(pl.String) if c in ("k", "s") else pl.col(c) for c in by]
            assert got.schema == want.schema
            assert got.sort(order).equals(want.sort(order)), (by, n)
        if n > 1 and wide:
            assert packing([df], ["a", "c", "d"]) is None  # 3 x 41 bits: the plain group-by ran
    with_null = pl.DataFrame({"a": [1, None, 1], "b": [None, 2, 2]}, schema={"a": pl.Int64, "b": pl.Int64})
    assert packing([with_null], ["a", "b"]) is None  # a null key must not merge groups
    got = group_by_packed(with_null, ["a", "b"], pl.len().alias("n"))
    assert got.sort("a", "b", nulls_last=True).rows() == [(1, 2, 1), (1, None, 1), (None, 2, 1)]


@pytest.mark.parametrize("wide", [False, True])
def test_join_key_agrees_with_a_join_on_the_columns(wide):
    from stepscope.analysis.frames import join_key

    rnd = random.Random(5)
    left, right = _frame(rnd, 200, wide), _frame(rnd, 50, wide).unique(["a", "b"])
    right = pl.concat([right, pl.DataFrame({"a": [None], "b": [1]}, schema={"a": pl.Int64, "b": pl.Int32})],
                      how="diagonal_relaxed")
    left = pl.concat([left, pl.DataFrame({"a": [None], "b": [1]}, schema={"a": pl.Int64, "b": pl.Int32})],
                     how="diagonal_relaxed")
    want = left.join(right.select("a", "b", pl.col("v").alias("w")), on=["a", "b"], how="left",
                     maintain_order="left")
    key = join_key(left, right, ["a", "b"])
    if wide:
        left = left.with_columns(a=pl.col("a") * (1 << 22))  # 63 bits of a: no key
        assert join_key(left, right, ["a", "b"]) is None
        return
    got = left.with_columns(key).join(right.select(key, pl.col("v").alias("w")), on="_key", how="left",
                                      maintain_order="left").drop("_key")
    assert got.equals(want)  # the null row matches nothing, as in the join on the columns


def test_grouped_array_steps_agree_with_a_loop_per_group():
    import numpy as np

    from stepscope.analysis.arrays import cummax_within, cumsum_within, group_bounds, last_at_or_before

    rnd = np.random.default_rng(3)
    groups = np.sort(rnd.integers(0, 6, 400)).astype(np.int32)
    x = rnd.integers(-10**12, 10**12, 400).astype(np.int64)
    starts = group_bounds(groups)
    ends = np.append(starts[1:], x.size)
    assert np.array_equal(cumsum_within(x, starts), np.concatenate([np.cumsum(x[a:b]) for a, b in zip(starts, ends)]))
    want = np.concatenate([np.maximum.accumulate(x[a:b]) for a, b in zip(starts, ends)])
    assert np.array_equal(cummax_within(x.copy(), groups, starts), want)
    times = np.concatenate([np.sort(rnd.integers(0, 10**9, b - a)) for a, b in zip(starts, ends)])
    qg = rnd.integers(0, 6, 100).astype(np.int32)
    qt = rnd.integers(-5, 10**9 + 5, 100)
    pairs = list(zip(groups.tolist(), times.tolist()))
    want = [max((i for i, p in enumerate(pairs) if p <= (g, t)), default=-1) for g, t in zip(qg.tolist(), qt.tolist())]
    assert last_at_or_before(groups, times, qg, qt).tolist() == want
    assert last_at_or_before(groups, times * (1 << 30), qg, qt) is None  # times of 60 bits: no room for the group
