"""Ingest of real nsys exports: counts and intervals against plain SQL and pipit's CSVs."""

from __future__ import annotations

import polars as pl
import pytest

from stepscope.ingest import read_trace
from tests.conftest import EXTERNAL, need, ro, sha256

EXPECTED_VERSIONS = {
    "nsysai_h100_2gpu_1s.sqlite": ("2026.2.1.210", "3.25.0"),
    "nsysai_mfu_2gpu_before.sqlite": ("2026.2.1.210", "3.25.0"),
    "nsysai_mfu_2gpu_after.sqlite": ("2026.2.1.210", "3.25.0"),
    "pipit_cloverleaf.sqlite": ("2024.5.1.113", "3.13.2"),
    "pipit_saxpy_2022.sqlite": ("2022.2.1.31", "2.9.1"),
}


def test_every_external_export_reads_with_sql_counts(external):
    before = sha256(external)
    t = read_trace(external)
    con = ro(external)
    n, dur, devices = con.execute(
        "SELECT count(*), sum(end - start), count(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    assert t.kernels.height == n
    assert (t.kernels["end"] - t.kernels["start"]).sum() == dur
    assert t.kernels["device"].n_unique() == devices
    n_memcpy = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()[0]
    assert t.memops.filter(pl.col("kind") == "memcpy").height == n_memcpy
    # runtime + driver calls only (old exports also hold CUDA-backtrace rows, eventClass 67), and
    # of those the launches, copies, sets, syncs and profiler start/stop
    n_api = con.execute("""
        SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        WHERE r.eventClass IN (0, 1) AND (s.value LIKE 'cudaLaunch%' OR s.value LIKE 'cuLaunch%'
           OR s.value LIKE 'cudaGraphLaunch%' OR s.value LIKE 'cudaMemcpy%' OR s.value LIKE 'cudaMemset%'
           OR s.value LIKE 'cuMemcpy%' OR s.value LIKE 'cuMemset%' OR s.value LIKE '%Synchronize%'
           OR s.value LIKE '%ProfilerSt%')""").fetchone()[0]
    assert t.api.height == n_api
    # every kernel name id decodes
    names = set(t.strings["id"].to_list())
    assert set(t.kernels["short_id"].to_list()) <= names
    assert set(t.kernels["demangled_id"].to_list()) <= names
    assert (t.nsys_version, t.schema_version) == EXPECTED_VERSIONS[external.name]
    assert sha256(external) == before  # opened read-only, never modified


def test_pid_tid_unpacked_from_global_ids():
    path = need(EXTERNAL / "pipit_cloverleaf.sqlite")
    t = read_trace(path)
    con = ro(path)
    pids = {r[0] for r in con.execute("SELECT pid FROM PROCESSES")}
    assert set(t.kernels["pid"].unique().to_list()) <= pids
    # pipit's reading of the same file names the API thread 1701896
    assert t.api["tid"].unique().to_list() == [1701896]


def test_thread_names():
    path = need(EXTERNAL / "pipit_cloverleaf.sqlite")
    t = read_trace(path)
    n = ro(path).execute("SELECT count(*) FROM ThreadNames").fetchone()[0]
    assert t.threads.height == n > 0
    main = t.threads.filter(pl.col("tid") == 1701896)  # the thread that launched every kernel
    assert main.height == 1 and main["pid"][0] == 1701896


def test_nvtx_ranges_decoded_from_string_ids():
    path = need(EXTERNAL / "pipit_saxpy_2022.sqlite")
    t = read_trace(path)
    assert t.nvtx.filter(pl.col("name") == "saxpy").height == 5
    assert t.nvtx.filter(pl.col("name") == "MPI_Send").height == 10


@pytest.mark.parametrize("adbc", [True, False])
@pytest.mark.parametrize("inline", [False, True])
def test_nvtx_names_match_sql_with_text_ids_or_inline_text(tmp_path, monkeypatch, adbc, inline):
    """Range names as a plain SQL join gives them: decoded from textId, or (older exports,
    no textId column) the inline text."""
    import shutil
    import sqlite3

    import stepscope.ingest.nsys_sqlite as ns
    from tests.conftest import FIXTURES

    src = need(FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite")
    path = tmp_path / src.name
    shutil.copy(src, path)
    if inline:
        con = sqlite3.connect(path)
        con.execute("UPDATE NVTX_EVENTS SET text = (SELECT value FROM StringIds WHERE id = textId) WHERE text IS NULL")
        con.execute("ALTER TABLE NVTX_EVENTS DROP COLUMN textId")
        con.commit()
        con.close()
    if not adbc:
        monkeypatch.setattr(ns, "_attach_adbc", lambda con, p: None)
    else:
        pytest.importorskip("adbc_driver_sqlite")
    got = read_trace(path, cache=False).nvtx
    want = ro(src).execute("""
        SELECT (n.globalTid >> 24) & 16777215, n.globalTid & 16777215, n.start, n.end, coalesce(n.text, s.value)
        FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
        WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL""").fetchall()
    assert got.height == len(want) == 132
    assert sorted(got.rows()) == sorted(want)


def test_gpu_table_when_present_and_absent():
    clover = read_trace(need(EXTERNAL / "pipit_cloverleaf.sqlite"))
    g = clover.gpus.row(0, named=True)
    assert g["name"] == "NVIDIA A100-SXM4-80GB" and g["sm_count"] == 108
    assert g["memory_bandwidth_bps"] == 2039040000000
    assert read_trace(need(EXTERNAL / "nsysai_h100_2gpu_1s.sqlite")).gpus.is_empty()


def test_cloverleaf_matches_pipit_csv_reading():
    """pipit's reader (another tool) gives every GPU activity's start, end and name."""
    path = need(EXTERNAL / "pipit_cloverleaf.sqlite")
    csv = pl.read_csv(EXTERNAL / "pipit_cloverleaf_gpu_trace.csv")
    enter = csv.filter((pl.col("Event Type") == "Enter") & (pl.col("type") == "kernel"))
    ref = enter.select(pl.col("Name").alias("name"), pl.col("Timestamp (ns)").alias("start"),
                       pl.col("_matching_timestamp").alias("end")).sort("start")
    t = read_trace(path)
    ours = t.kernels.select(t.name_of("short_id", "name"), "start", "end").sort("start")
    assert ours.height == ref.height == 1312
    assert ours["start"].to_list() == ref["start"].to_list()
    assert ours["end"].to_list() == ref["end"].to_list()
    assert ours["name"].to_list() == ref["name"].to_list()
    api_csv = pl.read_csv(EXTERNAL / "pipit_cloverleaf_cuda_api_trace.csv")
    # stepscope keeps launches, copies/sets, syncs and profiler calls (not cudaMalloc/cudaFree...)
    kept = pl.col("Name").str.contains(r"^(cudaLaunch|cudaMemcpy|cudaDeviceSynchronize)")
    api_ref = api_csv.filter((pl.col("Event Type") == "Enter") & kept).select(
        pl.col("Timestamp (ns)").alias("start"), pl.col("_matching_timestamp").alias("end")).sort("start")
    ours_api = t.api.select("start", "end").sort("start")
    assert ours_api.height == api_ref.height
    assert ours_api["end"].to_list() == api_ref["end"].to_list()


@pytest.mark.parametrize("content,msg", [
    (b"hello, not a database\n" * 10, "is not a SQLite file"),
    (b"SQLite format 3\x00" + b"\x00" * 200, "not a readable SQLite export"),
])
def test_bad_files_raise_one_line(tmp_path, content, msg):
    from stepscope.errors import InputError

    p = tmp_path / "bad.sqlite"
    p.write_bytes(content)
    with pytest.raises(InputError, match=msg):
        read_trace(p)


@pytest.mark.parametrize("name", ["llama8b_decode_b1_eager_tp2.sqlite", "nsysai_mfu_2gpu_before.sqlite"])
def test_arrow_reads_equal_sqlite3_reads(monkeypatch, name):
    """The ADBC bulk path (sliced by rowid over threads) returns exactly what sqlite3 returns."""
    pytest.importorskip("adbc_driver_sqlite")
    import stepscope.ingest.nsys_sqlite as ns
    from tests.conftest import FIXTURES

    path = need((FIXTURES if name.startswith("llama") else EXTERNAL) / name)
    monkeypatch.setattr(ns, "SLICE_MIN_ROWS", 100)  # force several slices on a small file
    fast = ns.read_nsys_sqlite(path)
    monkeypatch.setattr(ns, "_attach_adbc", lambda con, p: None)
    slow = ns.read_nsys_sqlite(path)
    for f in ("kernels", "memops", "api", "nvtx", "strings", "gpus", "processes", "threads"):
        assert getattr(fast, f).equals(getattr(slow, f)), f
