"""A cache that is never wrong: a changed export misses even with its size and mtime kept, an
entry of the wrong shape is ignored and rewritten, and a file written during its read is not
cached."""

from __future__ import annotations

import json
import os
import sqlite3

import polars as pl
import pytest

from stepscope.ingest import cache, nsys_sqlite, read_trace
from tests.conftest import FIXTURES, cache_export, need, sha256

K = "CUPTI_ACTIVITY_KIND_KERNEL"


@pytest.fixture
def export(tmp_path, monkeypatch):
    return cache_export(tmp_path, monkeypatch)


def entries(p):
    root = p.parent / ".stepscope-cache"
    return sorted(d for d in root.iterdir() if not d.name.startswith(".")) if root.exists() else []


def kernel_time(t) -> int:
    return int((t.kernels["end"] - t.kernels["start"]).sum())


def test_a_change_that_keeps_size_and_mtime_misses(export):
    first = read_trace(export, launch_config=False, cache=True)
    st = export.stat()
    con = sqlite3.connect(export)
    con.execute(f"UPDATE {K} SET end = end + 1000 WHERE rowid <= 10")  # same size: integers in place
    con.commit()
    con.close()
    os.utime(export, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (export.stat().st_size, export.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert cache.load(export, False, first.schema_version) is None
    second = read_trace(export, launch_config=False, cache=True)
    assert kernel_time(second) == kernel_time(first) + 10_000
    assert len(entries(export)) == 2  # the old entry answers only for the old content


def test_a_write_still_in_the_wal_misses(export):
    con = sqlite3.connect(export)
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    first = read_trace(export, launch_config=False, cache=True)
    writer = sqlite3.connect(export)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute(f"UPDATE {K} SET end = end + 7 WHERE rowid = 1")
    writer.commit()  # in the -wal file; the main file is untouched until a checkpoint
    try:
        assert (export.parent / (export.name + "-wal")).stat().st_size > 0
        assert cache.load(export, False, first.schema_version) is None
        assert kernel_time(read_trace(export, launch_config=False, cache=True)) == kernel_time(first) + 7
    finally:
        writer.close()


def _damage_meta(d, how):
    m = json.loads((d / "meta.json").read_text())
    if how == "not json":
        (d / "meta.json").write_text("{not json")
        return
    if how == "missing key":
        del m["profiler_overhead_ns"]
    elif how == "wrong type":
        m["graph_level_launches"] = "many"
    elif how == "bool for int":
        m["profiler_overhead_count"] = True
    elif how == "warnings not strings":
        m["warnings"] = [1, 2]
    elif how == "other format":
        m["cache_format"] = cache.FORMAT - 1
    elif how == "other key":
        m["key"] = "0" * 24
    elif how == "a list":
        m = [m]
    (d / "meta.json").write_text(json.dumps(m))


def _damage_frame(d, how):
    f = d / "kernels.parquet"
    df = pl.read_parquet(f)
    if how == "truncated":
        f.write_bytes(f.read_bytes()[:200])
    elif how == "missing column":
        df.drop("corr").write_parquet(f)
    elif how == "extra column":
        df.with_columns(pl.lit(1).alias("extra")).write_parquet(f)
    elif how == "wrong dtype":
        df.with_columns(pl.col("start").cast(pl.Float64)).write_parquet(f)
    elif how == "missing file":
        (d / "nvtx.parquet").unlink()
    elif how == "not parquet":
        (d / "strings.parquet").write_text("hello")


@pytest.mark.parametrize("damage,how", [(_damage_meta, h) for h in (
    "not json", "missing key", "wrong type", "bool for int", "warnings not strings", "other format", "other key",
    "a list")] + [(_damage_frame, h) for h in (
    "truncated", "missing column", "extra column", "wrong dtype", "missing file", "not parquet")])
def test_a_bad_entry_is_ignored_and_rewritten(export, damage, how):
    first = read_trace(export, launch_config=False, cache=True)
    (d,) = entries(export)
    damage(d, how)
    assert cache.load(export, False, first.schema_version) is None
    again = read_trace(export, launch_config=False, cache=True)  # from the export, then stored anew
    for f in cache.FRAMES:
        assert getattr(again, f).equals(getattr(first, f)), f
    assert len(entries(export)) == 1
    hit = cache.load(export, False, first.schema_version)
    assert hit is not None and hit.kernels.equals(first.kernels) and hit.warnings == first.warnings


def test_a_file_written_during_its_read_is_not_cached(export, monkeypatch):
    real = nsys_sqlite.read_nsys_sqlite

    def read_then_write(path, launch_config=True):
        t = real(path, launch_config)
        con = sqlite3.connect(path)
        con.execute(f"UPDATE {K} SET end = end + 1 WHERE rowid = 1")
        con.commit()
        con.close()
        return t

    monkeypatch.setattr(nsys_sqlite, "read_nsys_sqlite", read_then_write)
    read_trace(export, launch_config=False, cache=True)
    assert entries(export) == []


def test_entries_for_grid_and_without_do_not_mix(export):
    with_dims = read_trace(export, launch_config=True, cache=True)
    without = read_trace(export, launch_config=False, cache=True)
    assert len(entries(export)) == 2
    assert "grid_x" in cache.load(export, True, with_dims.schema_version).kernels.columns
    assert "grid_x" not in cache.load(export, False, without.schema_version).kernels.columns


def test_fingerprint_reads_no_fifo_and_changes_with_the_header(export, tmp_path):
    before = cache.fingerprint(export)
    os.mkfifo(export.parent / (export.name + "-journal"))  # a FIFO there must not block the open
    assert cache.fingerprint(export) != before
    os.unlink(export.parent / (export.name + "-journal"))
    assert cache.fingerprint(export) == before
    h = bytearray(export.read_bytes())
    h[24:28] = (int.from_bytes(h[24:28], "big") + 1).to_bytes(4, "big")  # the file change counter
    copy = tmp_path / "c.sqlite"
    copy.write_bytes(bytes(h))
    assert cache.fingerprint(copy) != before
    assert sha256(export) == sha256(need(FIXTURES / "llama8b_decode_b1_eager.sqlite"))
