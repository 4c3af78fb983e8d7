"""A cache that cannot be planted (issue 30): every Parquet file's SHA-256 is in its entry's
meta.json and checked on read (a mismatch is a miss and one warning, never an answer); an entry or
folder that is a symlink, another user's, or group/world-writable is not trusted; leftovers of a
killed write and entries beyond the size budget are pruned; a WAL export is cached on first read."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time

import polars as pl
import pytest

from stepscope.ingest import cache, read_trace
from tests.conftest import FIXTURES, cache_export, need, ro

K = "CUPTI_ACTIVITY_KIND_KERNEL"


@pytest.fixture
def export(tmp_path, monkeypatch):
    return cache_export(tmp_path, monkeypatch)


def entries(root):
    return sorted(d for d in root.iterdir() if not d.name.startswith(".")) if root.exists() else []


def sql_kernel_time(p) -> int:
    with ro(p) as c:
        return c.execute(f"SELECT SUM(end - start) FROM {K}").fetchone()[0]


def kernel_time(t) -> int:
    return int((t.kernels["end"] - t.kernels["start"]).sum())


def first_entry(export):
    t = read_trace(export, cache=True)
    assert t.cache_entry is not None
    return t.cache_entry


def test_the_checksums_are_in_the_meta(export):
    d = first_entry(export)
    import hashlib
    m = json.loads((d / "meta.json").read_text())
    assert m["sha256"] == {f: hashlib.sha256((d / f"{f}.parquet").read_bytes()).hexdigest() for f in cache.FRAMES}


@pytest.mark.parametrize("how", ["flip", "tripled"])
def test_an_altered_frame_is_a_miss_and_a_warning(export, how):
    d = first_entry(export)
    f = d / "kernels.parquet"
    if how == "flip":  # one bit in the middle of the file
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x10
        f.write_bytes(bytes(data))
    else:  # a well-formed Parquet file with every duration tripled
        k = pl.read_parquet(f)
        k.with_columns(end=pl.col("start") + 3 * (pl.col("end") - pl.col("start"))).write_parquet(f, compression="lz4")
    t = read_trace(export, cache=True)
    assert kernel_time(t) == sql_kernel_time(export)  # the export's own figure, not the entry's
    said = [w for w in t.warnings if "checksum" in w]
    assert len(said) == 1 and "kernels.parquet" in said[0]
    again = read_trace(export, cache=True)  # written anew: a hit, without the warning
    assert not [w for w in again.warnings if "cache" in w] and kernel_time(again) == sql_kernel_time(export)


def test_a_planted_entry_of_another_trace_is_not_served(export, tmp_path):
    other = tmp_path / "other.sqlite"
    shutil.copy(need(FIXTURES / "llama8b_decode_b1_graph.sqlite"), other)
    mine, theirs = first_entry(export), first_entry(other)
    for f in cache.FRAMES:  # their frames under my key, my meta kept: the checksums differ
        shutil.copy(theirs / f"{f}.parquet", mine / f"{f}.parquet")
    t = read_trace(export, cache=True)
    assert kernel_time(t) == sql_kernel_time(export) != sql_kernel_time(other)
    assert any("checksum" in w for w in t.warnings)


@pytest.mark.parametrize("what", ["entry", "root"])
@pytest.mark.parametrize("how", ["group-writable", "other-user"])
def test_an_entry_or_folder_of_others_is_not_trusted(export, what, how):
    d = first_entry(export)
    target = d if what == "entry" else d.parent
    if how == "group-writable":
        target.chmod(0o775 if what == "root" else 0o770)
    else:
        if os.getuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(target, 65534, 65534)
    t = read_trace(export, cache=True)
    said = [w for w in t.warnings if "not used" in w]
    assert len(said) == 1 and ("group or others" in said[0] or "another user" in said[0]), t.warnings
    assert kernel_time(t) == sql_kernel_time(export)


def test_a_symlinked_cache_folder_is_neither_read_nor_written(export, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (export.parent / ".stepscope-cache").symlink_to(elsewhere)
    t = read_trace(export, cache=True)
    assert list(elsewhere.iterdir()) == []  # no write went through the link
    assert t.cache_entry is not None and t.cache_entry.parent == tmp_path / "home-cache"
    assert any("symlink" in w for w in t.warnings)


def test_leftovers_of_a_killed_write_are_pruned(export):
    root = first_entry(export).parent
    old, new = root / ".tmp-killed", root / ".tmp-running"
    for d in (old, new):
        d.mkdir()
        (d / "kernels.parquet").write_bytes(b"x" * 1000)
    two_hours = time.time() - 7200
    os.utime(old, (two_hours, two_hours))
    removed = cache.prune(root)
    assert old in removed and not old.exists() and new.exists()  # a write under way is left alone


def test_entries_beyond_the_budget_go_oldest_first(export, tmp_path, monkeypatch):
    traces = [export]
    for i in range(2):
        p = tmp_path / f"t{i}.sqlite"
        shutil.copy(export, p)
        traces.append(p)
    made = []
    for i, p in enumerate(traces):
        made.append(first_entry(p))
        os.utime(made[-1], (time.time() - 1000 + i, time.time() - 1000 + i))
    size = sum(f.stat().st_size for f in made[0].iterdir())
    monkeypatch.setenv("STEPSCOPE_CACHE_MAX_BYTES", str(int(size * 2.5)))
    removed = cache.prune(made[0].parent)
    assert removed == [made[0]]  # the least recently used
    assert entries(made[0].parent) == sorted(made[1:])


def test_a_wal_export_is_cached_on_its_first_read(export):
    with sqlite3.connect(export) as c:
        assert c.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    assert export.read_bytes()[18:20] == b"\x02\x02"  # WAL mode in the header
    first = read_trace(export, cache=True)
    assert first.cache_entry is not None  # -wal/-shm made by the read did not void the key
    second = read_trace(export, cache=True)
    assert second.cache_entry is None and kernel_time(second) == sql_kernel_time(export)
    assert entries(export.parent / ".stepscope-cache") == [first.cache_entry]
