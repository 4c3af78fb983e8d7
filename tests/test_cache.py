"""The Parquet cache: same figures as the export, keyed on size/mtime, never inside the export."""

from __future__ import annotations

import os
import shutil
import sqlite3


from stepscope.ingest import cache, read_trace
from tests.conftest import FIXTURES, need, sha256


def _big_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "MIN_KERNELS", 100)  # the fixture has 420 kernels
    p = tmp_path / "trace.sqlite"
    shutil.copy(need(FIXTURES / "llama8b_decode_b1_eager.sqlite"), p)
    return p


def test_second_read_comes_from_the_cache_with_equal_frames(tmp_path, monkeypatch):
    p = _big_copy(tmp_path, monkeypatch)
    before = sha256(p)
    first = read_trace(p, launch_config=False, cache=True)
    entries = list((tmp_path / ".stepscope-cache").iterdir())
    assert len(entries) == 1 and (entries[0] / "kernels.parquet").exists()
    assert sha256(p) == before  # nothing written into the export
    os.chmod(p, 0o444)
    second = cache.load(p, False, first.schema_version)
    assert second is not None
    for f in cache.FRAMES:
        assert getattr(second, f).equals(getattr(first, f)), f
    assert (second.nsys_version, second.profiler_overhead_ns) == (first.nsys_version, first.profiler_overhead_ns)
    assert read_trace(p, launch_config=False, cache=False).kernels.equals(first.kernels)


def test_an_entry_with_other_dtypes_is_ignored(tmp_path, monkeypatch):
    """An entry written by a stepscope whose model had other dtypes (Int64 ids before) is a
    miss, not a trace of the wrong types."""
    import polars as pl

    p = _big_copy(tmp_path, monkeypatch)
    first = read_trace(p, launch_config=False, cache=True)
    entry = next((tmp_path / ".stepscope-cache").iterdir())
    assert cache.load(p, False, first.schema_version) is not None
    first.kernels.with_columns(pl.col("pid").cast(pl.Int64)).write_parquet(entry / "kernels.parquet")
    assert cache.load(p, False, first.schema_version) is None


def test_a_changed_export_misses_the_cache(tmp_path, monkeypatch):
    p = _big_copy(tmp_path, monkeypatch)
    t = read_trace(p, launch_config=False, cache=True)
    con = sqlite3.connect(p)
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid IN (SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 20)")
    con.commit()
    con.close()
    assert cache.load(p, False, t.schema_version) is None
    assert read_trace(p, launch_config=False, cache=True).kernels.height == t.kernels.height - 20


def test_read_only_folder_falls_back_to_the_cache_dir(tmp_path, monkeypatch):
    p = _big_copy(tmp_path, monkeypatch)
    home = tmp_path / "home-cache"
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(home))
    monkeypatch.setattr(cache, "_roots", lambda path: [tmp_path / "not-writable" / "x", home])
    (tmp_path / "not-writable").write_text("a file, so no folder can be made under it")
    read_trace(p, launch_config=False, cache=True)
    assert len(list(home.iterdir())) == 1


def test_small_exports_and_no_cache_write_nothing(tmp_path):
    p = tmp_path / "small.sqlite"
    shutil.copy(need(FIXTURES / "llama8b_decode_b1_eager.sqlite"), p)
    read_trace(p, cache=True)  # 420 kernels < MIN_KERNELS
    assert not (tmp_path / ".stepscope-cache").exists()


def test_analyze_no_cache_flag(tmp_path, monkeypatch):
    from tests.conftest import CliRunner

    from stepscope.cli import app

    p = _big_copy(tmp_path, monkeypatch)
    r = CliRunner().invoke(app, ["analyze", str(p), "--json", "--no-cache"])
    assert r.exit_code == 0 and not (tmp_path / ".stepscope-cache").exists()
    r2 = CliRunner().invoke(app, ["analyze", str(p), "--json"])
    assert (tmp_path / ".stepscope-cache").exists()
    r3 = CliRunner().invoke(app, ["analyze", str(p), "--json"])  # from the cache
    assert r.stdout == r2.stdout == r3.stdout
