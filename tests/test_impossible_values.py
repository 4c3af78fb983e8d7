"""Values that cannot be right are reported (left out, counted), and values that are merely
extreme (ids near 2^63, negative ids, sparse string ids) give the same figures as ordinary ones."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time

import polars as pl
import pytest
from tests.conftest import CliRunner

from stepscope.analysis.inventory import impossible_figures
from stepscope.analysis.notes import as_data, from_data
from stepscope.render.sentences import warning_texts
from stepscope.cli import app
from stepscope.ingest import nsys_sqlite as ns
from tests.conftest import FIXTURES, need, sha256

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"
K, R = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
ACTS = (K, "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_MEMCPY")


def mutated(tmp_path, *sql: str, source=EAGER, name="m.sqlite"):
    p = tmp_path / name
    shutil.copy(need(source), p)
    con = sqlite3.connect(p)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    for s in sql:
        for t in ACTS:  # statements written for the kernel table apply to every activity table
            if "{T}" in s and t in tables:
                con.execute(s.replace("{T}", t))
        if "{T}" not in s:
            con.execute(s)
    con.commit()
    con.close()
    return p


def run(*args):
    r = CliRunner().invoke(app, [*map(str, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def doc_of(p) -> dict:
    r = run("analyze", p, "--json", "--no-cache")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    d.pop("trace")
    return d


def one_line_2(r) -> str:
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1
    return r.output


# --- values that cannot be right -----------------------------------------------------------

@pytest.mark.parametrize("sql,warning", [
    (f"UPDATE {K} SET end = start - 1000 WHERE rowid IN (5, 9)", "2 of 420 kernels left out (2 ending before they start)"),
    (f"UPDATE {K} SET end = start + 4000000000000 WHERE rowid = 5", "1 of 420 kernels left out (1 lasting over an hour)"),
    (f"UPDATE {K} SET start = 5000000000000000000, end = 5000000000000000001 WHERE rowid = 5",
     "1 of 420 kernels left out (1 with a timestamp beyond ±2^62 ns)"),
    (f"UPDATE {K} SET start = -9223372036854775807 WHERE rowid = 5",
     "1 of 420 kernels left out (1 with a timestamp beyond ±2^62 ns)"),
    (f"UPDATE {K} SET start = -9223372036854775808 WHERE rowid = 5",  # whose abs() wraps in int64
     "1 of 420 kernels left out (1 with a timestamp beyond ±2^62 ns)"),
    (f"UPDATE {K} SET shortName = 777777 WHERE rowid = 5",
     "1 of 420 kernels left out (1 with a shortName id not in StringIds)"),
    (f"UPDATE {K} SET demangledName = 2147483647 WHERE rowid IN (5, 6, 7)",
     "3 of 420 kernels left out (3 with a demangledName id not in StringIds)"),
])
def test_impossible_kernels_are_left_out_and_counted(tmp_path, sql, warning):
    p = mutated(tmp_path, sql)
    before = sha256(p)
    d = doc_of(p)
    assert warning in d["warnings"], d["warnings"]
    left = int(warning.split(" of ")[0])
    step = d["steps"][0]
    assert step["n_kernels"] == 420 - left
    # the figures of what is left are those of a trace without the bad rows
    q = mutated(tmp_path, f"DELETE FROM {K} WHERE rowid IN ({_rowids(sql)})", name="deleted.sqlite")
    clean = doc_of(q)["steps"][0]
    for key in ("n_kernels", "kernel_time_sum_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns", "classes"):
        assert step[key] == clean[key], key
    assert sha256(p) == before


def _rowids(sql: str) -> str:
    where = sql.split("WHERE rowid ")[1]
    return where[4:-1] if where.startswith("IN (") else where.split("= ")[1]


@pytest.mark.parametrize("value", [9223372036854775807, -5])
def test_memops_of_impossible_sizes(tmp_path, value):
    """A memset of 2^63-1 bytes failed the byte budget's sum (exit 3); a negative one lowered it."""
    p = mutated(tmp_path, f"UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET bytes = {value}")
    assert "1 of 1 memcpy/memset rows left out (1 with a byte count below 0 or beyond 2^48)" in doc_of(p)["warnings"]
    cells = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"
    r = run("budget", p, "--cells", cells, "--json")
    assert r.exit_code == 0, r.output
    base = json.loads(run("budget", EAGER, "--cells", cells, "--json").stdout)["step"]
    step = json.loads(r.stdout)["step"]
    assert step["joined"]["trace"] == 0 and base["joined"]["trace"] == 1
    assert 0 < step["measured_bytes"] < base["measured_bytes"]


def test_api_calls_lasting_decades(tmp_path):
    """Launch calls shifted to last 2^61 ns each: their sum per step left int64 (a negative
    launch_call_ns)."""
    p = mutated(tmp_path, f"""UPDATE {R} SET end = end + {1 << 61} WHERE rowid IN (SELECT r.rowid FROM {R} r
                                JOIN StringIds s ON s.id = r.nameId WHERE s.value GLOB 'cu*LaunchKernel*')""")
    d = doc_of(p)
    assert any("API calls left out (420 lasting over an hour)" in w for w in d["warnings"]), d["warnings"]
    assert d["steps"][0]["n_launch_calls"] == 0 and d["steps"][0]["launch_call_ns"] == 0


def test_api_calls_and_ranges_ending_before_they_start(tmp_path):
    p = mutated(tmp_path, f"""UPDATE {R} SET end = start - 1 WHERE rowid IN (SELECT r.rowid FROM {R} r
                                JOIN StringIds s ON s.id = r.nameId WHERE s.value GLOB 'cu*LaunchKernel*' LIMIT 3)""",
                "UPDATE NVTX_EVENTS SET end = start - 5")
    d = doc_of(p)
    assert d["steps"][0]["n_launch_calls"] == 417
    assert "1 of 1 NVTX ranges left out (1 ending before they start)" in d["warnings"]
    assert any(w.startswith("3 of ") and "API calls left out (3 ending before they start)" in w for w in d["warnings"])
    assert d["steps"][0]["delimiter"] == "capture"  # the step range is gone: the capture range delimits


def test_a_trace_with_zero_kernels_is_refused(tmp_path):
    r = run("analyze", mutated(tmp_path, f"DELETE FROM {K}"))
    assert "no kernels recorded — was `--trace=cuda` on?" in one_line_2(r)
    for cmd in (["tp"], ["export", "-o", tmp_path / "x.json"], ["report", "-o", tmp_path / "x.md"]):
        r = run(cmd[0], tmp_path / "m.sqlite", *cmd[1:])
        assert "no kernels recorded" in one_line_2(r)


def test_a_trace_whose_kernels_are_all_bad_says_why(tmp_path):
    r = run("analyze", mutated(tmp_path, f"UPDATE {K} SET start = 'x'"))
    assert "no usable kernels" in one_line_2(r) and "start not an integer in 420" in r.output
    r = run("analyze", mutated(tmp_path, f"UPDATE {K} SET end = start - 1", name="n.sqlite"))
    assert "no usable kernels: all 420 were left out" in one_line_2(r) and "ending before they start" in r.output


def test_a_trace_without_string_ids_is_refused(tmp_path):
    r = run("analyze", mutated(tmp_path, "DROP TABLE StringIds"))
    assert "has no StringIds table" in one_line_2(r)


def test_nvtx_ranges_whose_text_id_points_nowhere(tmp_path):
    p = mutated(tmp_path, "UPDATE NVTX_EVENTS SET textId = 999999, text = NULL")
    d = doc_of(p)
    assert "NVTX_EVENTS: 1 ranges have no name (their textId is not in StringIds)" in d["warnings"]


def test_impossible_figures_are_reported():
    steps = pl.DataFrame({"step": [0, 1, 2], "step_time_ns": [10, -5, 10], "gpu_busy_ns": [5, 5, 9],
                          "gpu_span_ns": [6, 6, 8], "idle_ns": [1, 1, -1], "kernel_time_sum_ns": [5, 5, 9]})
    classes = pl.DataFrame({"step": [0, 0, 1, 1, 2], "class": ["gemm", "other", "gemm", "other", "gemm"],
                            "count": [1, 1, 1, 1, 1], "time_ns": [10, -4, 10, 2, 9]})
    notes = impossible_figures(steps, classes)
    # data, not words: codes and fields, worded by render/sentences.py, and the same after a kept
    # analysis stores them as JSON and reads them back (a step list comes back a tuple)
    assert [n.code for n in notes] == ["bad_coverage", "bad_times", "bad_times"]
    assert from_data(json.loads(json.dumps(as_data(notes)))) == notes
    out = warning_texts(notes)
    assert out[0].startswith("1 step(s) have a coverage outside 0-100 % (166.7% to 166.7%; steps 0)")
    assert out[1].startswith("1 step(s) have GPU busy above its span (steps 2)")
    assert out[2].startswith("2 step(s) have a negative time (steps 1, 2)")
    assert impossible_figures(steps.head(1).with_columns(gpu_busy_ns=pl.lit(5)), classes.filter(pl.col("time_ns") > 0)) == []


# --- values that are extreme but right -------------------------------------------------------

def test_correlation_ids_near_2_63_join_exactly(tmp_path):
    """The (pid, correlationId) join packed both into one int64, exact only below 2^39: ids
    above collided or overflowed and joined kernels to the wrong calls."""
    shift = 1 << 62
    for src in (EAGER, TP2):
        base = doc_of(need(src))
        p = mutated(tmp_path, f"UPDATE {{T}} SET correlationId = correlationId + {shift}",
                    f"UPDATE {R} SET correlationId = correlationId + {shift}", source=src, name=f"c{src.name}")
        assert doc_of(p) == base


def test_negative_and_wide_ids_give_the_same_figures(tmp_path):
    base = doc_of(need(EAGER))
    # devices and streams at the ends of 32 bits; every string id negated (packed keys offset
    # ids by 2^31: a negative id unpacked wrong and failed the cast)
    p = mutated(tmp_path, "UPDATE {T} SET deviceId = 2147483647, streamId = -2147483648 + streamId",
                "UPDATE TARGET_INFO_GPU SET id = 2147483647",
                "UPDATE StringIds SET id = -id - 1",
                f"UPDATE {K} SET shortName = -shortName - 1, demangledName = -demangledName - 1",
                f"UPDATE {R} SET nameId = -nameId - 1", "UPDATE ThreadNames SET nameId = -nameId - 1",
                "UPDATE NVTX_EVENTS SET textId = -textId - 1 WHERE textId IS NOT NULL")
    d = doc_of(p)
    assert d["steps"][0]["device"] == 2147483647 and d["gpus"][0]["device"] == 2147483647
    for s in (base, d):
        s["steps"][0]["device"] = s["gpus"][0]["device"] = 0
    assert d == base


def test_sparse_string_ids_do_not_allocate_a_table_per_id(tmp_path):
    """Ids near 2^31 made the id-indexed lookup tables 2^31 slots long."""
    base = doc_of(need(EAGER))
    p = mutated(tmp_path, "UPDATE StringIds SET id = id + 2147480000",
                f"UPDATE {K} SET shortName = shortName + 2147480000, demangledName = demangledName + 2147480000",
                f"UPDATE {R} SET nameId = nameId + 2147480000", "UPDATE ThreadNames SET nameId = nameId + 2147480000",
                "UPDATE NVTX_EVENTS SET textId = textId + 2147480000 WHERE textId IS NOT NULL")
    t = time.perf_counter()
    d = doc_of(p)
    assert time.perf_counter() - t < 20
    assert d == base


def test_both_read_paths_leave_out_the_same_rows(tmp_path, monkeypatch):
    pytest.importorskip("adbc_driver_sqlite")
    p = mutated(tmp_path, f"UPDATE {K} SET end = start - 1 WHERE rowid = 3", f"UPDATE {K} SET shortName = 1234567 WHERE rowid = 4")
    fast = ns.read_nsys_sqlite(p)
    monkeypatch.setattr(ns, "_attach_adbc", lambda con, path: None)
    slow = ns.read_nsys_sqlite(p)
    assert fast.kernels.equals(slow.kernels) and fast.warnings == slow.warnings
    assert fast.kernels.height == 418


def test_ranks_delimited_differently(tmp_path):
    """A TP trace whose one rank lost its step range: that rank falls back to its capture range.
    Concatenating the NVTX windows (Int32 ids) with the capture windows (Int64) failed, exit 3."""
    p = mutated(tmp_path, "DELETE FROM NVTX_EVENTS WHERE rowid = 3", source=TP2)
    d = doc_of(p)
    assert sorted((s["pid"], s["delimiter"]) for s in d["steps"]) == [(798, "nvtx"), (799, "capture")]
    base = {s["pid"]: s for s in doc_of(need(TP2))["steps"]}
    for s in d["steps"]:
        assert s["n_kernels"] == base[s["pid"]]["n_kernels"]


def test_compare_with_a_b_thousands_of_times_slower(tmp_path):
    """The speedup was rounded to four decimals: 0.0 for B 36,000x slower, and the verdict
    divided by it."""
    p = mutated(tmp_path, f"UPDATE {K} SET end = end + {1 << 40}")  # 18 minutes a kernel
    r = run("compare", EAGER, p, "--json", "--no-cache")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert 2.7e-5 < doc["speedup"] < 2.8e-5 and "36818.85× slower" in doc["verdict"]
    r = run("compare", EAGER, p, "--fail-above", "5", "--no-cache")
    assert r.exit_code == 1 and "worse than A's (limit 5.0%)" in r.output
