"""The byte side on the real H200 data: the committed ncu CSVs and sweep (fixtures/ncu/) and
the committed llama-3.1-8b step traces. Expected values are read here independently (Python's
csv module over the raw ncu text, plain SQL over the traces, hand arithmetic), never taken
from the code under test."""

from __future__ import annotations

import csv
import json

import polars as pl
import pytest
from tests.conftest import CliRunner

from conftest import FIXTURES, need, ro
from stepscope.bytes import ncu
from stepscope.bytes.cells import import_ncu

NCU = FIXTURES / "ncu"
RAW = NCU / "h200_llama8b_ncu_raw.csv"
SMOKE = NCU / "smoke_ncu_raw.csv"
SWEEP = NCU / "h200_llama8b_sweep.parquet"
SINGLE = NCU / "h200_llama8b_single_cells.csv"


def csv_rows(path) -> list[dict]:
    """Every profiled launch of a raw ncu text, with the csv module: lines before each
    `"ID",` header are log lines, the row after the header is the units row."""
    out, header = [], None
    for row in csv.reader(path.read_text().splitlines()):
        if not row or row[0].startswith("=="):
            header = None if row and row[0].startswith("==STEPSCOPE") else header
            continue
        if row[0] == "ID":
            header = row
            continue
        if header and row[0].strip():
            out.append(dict(zip(header, row)))
    return out


def num(s: str) -> int:
    return int(s.replace(",", ""))


@pytest.mark.parametrize("path", [RAW, SMOKE], ids=["sweep", "smoke"])
def test_reader_matches_csv_module_on_real_ncu(path):
    want = csv_rows(need(path))
    assert want, "no launches read by the csv module"
    res = ncu.parse_files([path])
    got = [ncu.launch_record(d) for d in res.launches]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["kernel"] == w["Kernel Name"]
        assert g["grid"] == w["Grid Size"] and g["block"] == w["Block Size"]
        gx, gy, gz = (int(x) for x in w["Grid Size"].strip("()").split(", "))
        assert (g["grid_x"], g["grid_y"], g["grid_z"]) == (gx, gy, gz)
        assert g["dram_read_bytes"] == num(w["dram__bytes_read.sum"])
        assert g["dram_write_bytes"] == num(w["dram__bytes_write.sum"])
        assert g["duration_ns"] == num(w["gpu__time_duration.sum"])
        assert g["l2_hit_pct"] == pytest.approx(float(w["lts__t_sector_hit_rate.pct"]))
    # the real files carry thousands separators in the byte counts, and ==PROF== lines
    assert any("," in w["dram__bytes_read.sum"] for w in want)
    assert any(ln.startswith("==PROF== Connected") for ln in res.log_lines)
    assert res.units["dram__bytes_read.sum"] == "byte"


def test_import_real_ncu_names_the_gpu():
    df = import_ncu([need(RAW)])
    want = csv_rows(RAW)
    assert df.height == len(want)
    assert set(df["gpu"].to_list()) == {"NVIDIA H200"}
    lm = [w for w in want if w["Kernel Name"].startswith("nvjet_sm90_tst_256x8_64x6")]
    assert num(lm[0]["dram__bytes_read.sum"]) in df["dram_read_bytes"].to_list()


def test_sweep_cells_are_the_raw_launches_in_order():
    """The committed cells table = the raw ncu launches minus the marker spin kernels."""
    cells = pl.read_parquet(need(SWEEP))
    assert cells.height == pl.read_csv(NCU / "h200_llama8b_sweep.csv").height
    assert cells["error"].is_null().all() and cells["matched"].all()
    assert cells["cell"].n_unique() == 52
    raw = [w for w in csv_rows(RAW) if "spin_kernel" not in w["Kernel Name"]]
    raw = raw[: cells.height]  # the raw text ends with the two single-cell runs
    assert [num(w["dram__bytes_read.sum"]) for w in raw] == cells["dram_read_bytes"].to_list()
    assert [w["Kernel Name"] for w in raw] == cells["kernel"].to_list()


def _cell(cells, name):
    return cells.filter(pl.col("cell") == name)


def test_sweep_against_the_seed_h200_references():
    cells = pl.read_parquet(need(SWEEP))
    # decode LM head reads ~1.05 GB (seed: "1.05 GB per step")
    lm = _cell(cells, "gemm_lm_head_m1").row(0, named=True)
    assert lm["dram_read_bytes"] == pytest.approx(1.05e9, rel=0.01)
    assert 4096 * 128256 * 2 <= lm["dram_read_bytes"]  # the weight, read once
    # decode GEMM amplification 1.00-1.07 (all launches of the cell, split-K reduce included)
    for proj, (k, n) in {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
                         "down": (14336, 4096), "lm_head": (4096, 128256)}.items():
        c = _cell(cells, f"gemm_{proj}_m1")
        moved = (c["dram_read_bytes"] + c["dram_write_bytes"]).sum()
        minimum = (k * n + k + n) * 2  # W + x + y, bf16, one token
        assert c["cell_min_bytes"][0] == minimum
        assert 0.99 <= moved / minimum <= 1.07, proj
    # QKV at M=2048 moves more than its 92.3 MB minimum (seed: amplification 1.46)
    q = _cell(cells, "gemm_qkv_m2048")
    qmin = (4096 * 6144 + 2048 * 4096 + 2048 * 6144) * 2
    assert qmin == q["cell_min_bytes"][0] == 92_274_688
    moved = int((q["dram_read_bytes"] + q["dram_write_bytes"]).sum())
    assert moved > 1.3 * qmin
    # the seed-way single-cell cross-check agrees within 1%
    s = [w for w in csv.DictReader(need(SINGLE).open()) if w["cell"] == "gemm_qkv_m2048"][0]
    assert int(s["dram_read_bytes"]) + int(s["dram_write_bytes"]) == pytest.approx(moved, rel=0.01)


# --- stepscope budget on the committed step traces -----------------------------------------

DECODE_MIN_B1 = 15_289_851_408  # minbytes hand values (test_bytes_minbytes): the seed's 15.29 GB


def _budget(trace):
    from stepscope.cli import app

    r = CliRunner().invoke(app, ["budget", str(need(FIXTURES / trace)), "--cells", str(SWEEP),
                                 "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _sql_counts(trace):
    with ro(FIXTURES / trace) as con:
        k = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        m, b = con.execute("SELECT count(*), coalesce(sum(bytes), 0) "
                           "FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()
    return k, m, b


@pytest.mark.parametrize("trace", [
    "llama8b_decode_b1_eager.sqlite", "llama8b_decode_b1_graph.sqlite",
    "llama8b_decode_b8_eager.sqlite", "llama8b_decode_b8_graph.sqlite",
    "llama8b_prefill_b1_eager.sqlite"])
def test_budget_on_real_step(trace):
    d = _budget(trace)
    st, kern = d["step"], d["kernels"]
    n_kernels, n_memsets, memset_bytes = _sql_counts(trace)  # one step per capture
    assert st["calls"] == n_kernels + n_memsets
    # every kernel joined or explicitly listed
    listed = sum(u["count"] for u in st["unjoined_kernels"])
    assert sum(st["joined"].values()) + listed == st["calls"]
    assert sum(k["count"] for k in kern if k["join"] is None) == listed
    assert all(u["reason"] for u in st["unjoined_kernels"])
    assert st["joined"]["trace"] == n_memsets
    assert sum(k["measured_bytes"] for k in kern if k["join"] == "trace") == memset_bytes
    # the step total is the sum of its rows (and of its kernels)
    assert st["measured_bytes"] == sum(r["measured_bytes"] or 0 for r in d["rows"])
    assert st["measured_bytes"] == sum(k["measured_bytes"] or 0 for k in kern)
    assert st["min_bytes"] == sum(r["min_bytes"] or 0 for r in d["rows"])
    # every planned op is measured with as many calls as the plan has
    for r in d["rows"]:
        if r["min_calls"]:
            assert r["calls"] == r["min_calls"], r
    # sane: above the minimum, not by much (weights dominate the decode step)
    amp = st["measured_bytes"] / st["min_bytes"]
    if "decode" in trace:
        assert 1.0 < amp < 1.05
    else:
        assert 1.2 < amp < 1.7  # prefill GEMMs at M=2048 re-read their operands


def test_budget_decode_b1_figures():
    d = _budget("llama8b_decode_b1_eager.sqlite")
    st = d["step"]
    assert st["min_bytes"] == DECODE_MIN_B1
    assert st["measured_bytes"] == pytest.approx(15.53e9, rel=0.005)
    rows = {(r["class"], r["op"]): r for r in d["rows"]}
    cells = pl.read_parquet(SWEEP)
    lm = _cell(cells, "gemm_lm_head_m1")
    assert rows[("gemm", "gemm:lm_head")]["measured_bytes"] == int(
        (lm["dram_read_bytes"] + lm["dram_write_bytes"]).sum())
    # split-K reduce: one launch shape after both o and down, 32 calls each
    sk = [k for k in d["kernels"] if k["class"] == "splitk_reduce"]
    assert sorted((k["op"], k["count"]) for k in sk) == [("gemm:down", 32), ("gemm:o", 32)]
    # cuDNN decode attention (another kernel than the sweep's batch-64 cell): joined by op,
    # scaled to batch 1 -> ~ its 8.4 MB per-layer minimum; the split-KV combine is listed
    att = rows[("attention_decode", "attn_decode")]
    assert att["calls"] == 32
    kv = 2048 * 8 * 128 * 2 * 2  # K+V of one layer, bf16
    assert kv <= att["measured_bytes_per_call"] <= 1.02 * (kv + 2 * 4096 * 2)
    names = [u["name"] for u in st["unjoined_kernels"]]
    assert names == ["lean_reduction_kernel"]


def test_budget_prefill_shares_one_kernel_among_three_projections():
    d = _budget("llama8b_prefill_b1_eager.sqlite")
    coop = [k for k in d["kernels"] if k["name"].startswith("nvjet_sm90_tst_256x128_64x4")]
    assert sorted((k["op"], k["count"]) for k in coop) == [
        ("gemm:down", 32), ("gemm:o", 32), ("gemm:qkv", 32)]
    # the prefill LM head runs on the last token: the M=1 cell, not the M=2048 one
    lm = [k for k in d["kernels"] if k["op"] == "gemm:lm_head"]
    assert [k["cell"] for k in lm] == ["gemm_lm_head_m1"]


def test_budget_tp2_rank_is_flagged():
    d = _budget("llama8b_decode_b1_eager_tp2.sqlite")
    st = d["step"]
    assert st["tp"] == 2 and any("TP=2" in w for w in d["warnings"])
    listed = sum(u["count"] for u in st["unjoined_kernels"])
    assert sum(st["joined"].values()) + listed == st["calls"]
    assert {u["class"] for u in st["unjoined_kernels"]} >= {"comm"}


# --- the step's own kernels, measured in launch order (cells run --engine torch on the H200) ----
STEP_CELLS = NCU / "step_torch_llama8b_decode_b1"
R5_EAGER = FIXTURES / "round5" / "llama8b_decode_b1_eager.sqlite"


def test_budget_by_launch_order_on_the_real_torch_step():
    """`cells run --engine torch` measured the 388 kernels of a decode step one by one; the budget
    joins them to the nsys capture of the same step shape by launch order (checked by name).
    Independent figures: the raw ncu CSV (parsed here with the csv module) and plain SQL."""
    import csv
    import sqlite3

    from stepscope.bytes.budget import budget_order, step_kernels_from_inventory, step_sequence_from_inventory
    from stepscope.api import open_trace
    from stepscope.bytes.cells import read_cells

    inv = open_trace(R5_EAGER).inventory
    cells = read_cells(STEP_CELLS / "cells.parquet")
    res = budget_order(step_sequence_from_inventory(inv, 0), cells, "llama-3.1-8b", 1, 2048, "decode",
                       "NVIDIA H200", memops=step_kernels_from_inventory(inv, 0, memops=True))
    rows = [r for r in csv.reader(l for l in open(STEP_CELLS / "ncu_raw.csv") if l.startswith('"'))]
    head, data = rows[0], rows[2:]
    ir, iw = head.index("dram__bytes_read.sum"), head.index("dram__bytes_write.sum")
    ncu_bytes = sum(int(r[ir].replace(",", "")) + int(r[iw].replace(",", "")) for r in data)
    con = sqlite3.connect(f"file:{R5_EAGER}?mode=ro", uri=True)
    n_kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    memset_bytes = con.execute("SELECT sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()[0]
    st = res.step
    assert len(data) == n_kernels == 388 and st["order"] == {"step_kernels": 388, "profiled_kernels": 388,
                                                              "joined": 388}
    assert st["measured_bytes"] == ncu_bytes + memset_bytes
    assert st["min_bytes"] == st["plan_min_bytes"] == 15_289_851_408 and st["unjoined_ops"] == []
    lm = res.rows.filter(pl.col("op") == "gemm:lm_head").row(0, named=True)
    last = [r for r in data if r[head.index("Kernel Name")].startswith("nvjet")][-1]
    assert lm["calls"] == 1 and lm["measured_bytes"] == int(last[ir].replace(",", "")) + int(last[iw].replace(",", ""))
    assert 1.04e9 < lm["measured_bytes"] < 1.07e9  # the seed's decode LM head: 1.05 GB
    assert round(st["amplification"], 3) == 1.034
    # the light ops moved fewer DRAM bytes than their minimum: L2 served them, and the report says so
    below = res.rows.filter(pl.col("amplification") < 1)
    assert set(below["op"]) == {"silu_mul", "embedding", "kv_write", "add_norm", "norm", "rope", "argmax"}
    assert below["note"].str.starts_with("L2-served").all()
    res.self_check()


def test_budget_command_reads_the_shape_from_the_sidecar():
    """vLLM's step names carry neither model nor context: budget takes them from the capture's
    sidecar; with the vLLM step's window the LM head is in the step (1.05 GB joined)."""
    from stepscope.cli import app

    trace = FIXTURES / "vllm" / "llama8b_decode_b1_eager.sqlite"
    r = CliRunner().invoke(app, ["budget", str(trace), "--cells", str(SWEEP), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["model"] == "llama-3.1-8b" and doc["step"]["context"] == 2048
    lm = [x for x in doc["rows"] if x["op"] == "gemm:lm_head"][0]
    assert lm["calls"] == 1 and 1.04e9 < lm["measured_bytes"] < 1.06e9
    assert doc["step"]["measured_bytes"] >= doc["step"]["min_bytes"]


def test_imported_cells_are_named_after_their_file():
    df = import_ncu([SMOKE])
    rows = csv_rows(SMOKE)  # in file order: three ncu runs, each numbering its launches from 0
    assert df["cell"].to_list() == [f"smoke_ncu_raw#{n}" for n in range(len(rows))]
    assert df["id"].to_list() == [int(r["ID"]) for r in rows]


VLLM = FIXTURES / "vllm"


@pytest.mark.parametrize("trace,cells_dir,batch", [
    ("llama8b_decode_b1_eager_sync.sqlite", "step_vllm_llama8b_decode_b1", 1),
    ("llama8b_decode_b8_eager_sync.sqlite", "step_vllm_llama8b_decode_b8", 8),
    # the fifth round's capture (async scheduling on, full KV cache): the same 436 kernels
    ("llama8b_decode_b1_eager.sqlite", "step_vllm_llama8b_decode_b1", 1),
], ids=["b1", "b8", "b1-async-capture"])
def test_budget_by_launch_order_on_the_real_vllm_step(trace, cells_dir, batch):
    """`cells run --engine vllm` measured every kernel of a real vLLM 0.26 decode step under ncu
    (application replay, fixtures/round6/); budget joins them to the nsys capture of that step by
    launch order. Independent figures: the raw ncu CSV (csv module) and plain SQL."""
    import csv
    import sqlite3

    from stepscope.bytes.cells import read_cells
    from stepscope.cli import app

    path, cdir = VLLM / trace, NCU / cells_dir
    r = CliRunner().invoke(app, ["budget", str(path), "--cells", str(cdir / "cells.parquet"), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    rows = [x for x in csv.reader(ln for ln in open(cdir / "ncu_raw.csv") if ln.startswith('"'))]
    head, data = rows[0], rows[2:]
    ir, iw = head.index("dram__bytes_read.sum"), head.index("dram__bytes_write.sum")
    ncu_bytes = sum(num(x[ir]) + num(x[iw]) for x in data)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n_kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    memops = sum(con.execute(f"SELECT coalesce(sum(bytes), 0) FROM {t}").fetchone()[0]
                 for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
    st = doc["step"]
    assert len(data) == n_kernels == 436
    assert st["order"] == {"step_kernels": 436, "profiled_kernels": 436, "joined": 436}
    # every kernel joined: the step's bytes are the profiled kernels' DRAM bytes plus its memops
    # (a device-to-host copy counts its bytes once; these traces have no device-to-device copy)
    assert st["measured_bytes"] == ncu_bytes + memops
    assert st["measured_bytes"] >= st["min_bytes"] and st["unjoined_ops"] == []
    # the LM head: its own op, the step's last GEMM, ≈ the seed's 1.05 GB (128256 x 4096 bf16)
    lm = [x for x in doc["rows"] if x["op"] == "gemm:lm_head"]
    last = [x for x in data if x[head.index("Kernel Name")].startswith("nvjet")][-1]
    assert len(lm) == 1 and lm[0]["calls"] == 1
    assert lm[0]["measured_bytes"] == num(last[ir]) + num(last[iw])
    assert abs(lm[0]["measured_bytes"] / (128256 * 4096 * 2) - 1) < 0.005
    # FA3's decode attention (device_kernel) and its prepare_varlen_num_blocks_kernel are measured
    attn = [x for x in doc["rows"] if x["class"] == "attention_decode"]
    assert sum(x["calls"] for x in attn) == 65 and all(x["measured_bytes"] > 0 for x in attn)
    # bytes from the seed's arithmetic: batch 1's step minimum is the torch step's 15,289,851,408 B
    if batch == 1:
        assert st["min_bytes"] == 15_289_851_408
    meta = json.loads((cdir / "step_cells.json").read_text())
    assert meta["replay_mode"] == "application" and meta["target_processes"] == "application-only"
    # application replay: ncu ran the engine once per pass (3 runs), each kernel took 3 passes
    raw = (cdir / "ncu_raw.csv").read_text().splitlines()
    assert sum(ln.startswith("==PROF== Connected to process") for ln in raw) == 3
    cells = read_cells(cdir / "cells.parquet")
    assert set(cells["profiler__replayer_passes"].to_list()) == {3.0}


def test_kernel_base_reads_names_whose_return_type_holds_parentheses():
    """nsys demangles vLLM's fused_add_rms_norm_kernel with '(int)0' in its enable_if return
    type, ncu without; read left to right, the nsys name was 'enable_if' and 64 kernels of the
    vLLM step joined no profiled kernel."""
    from stepscope.bytes.budget import kernel_base

    nsys = ("std::enable_if<T2>(int)0&&vllm::_typeConvert<T1>::exists, void>::type "
            "vllm::fused_add_rms_norm_kernel<c10::BFloat16, (int)8, (bool)1>(T1 *, long, T1 *, "
            "const T1 *, float, int, int)")
    ncu_name = ("std::enable_if<T2>0&&vllm::_typeConvert<T1>::exists, void>::type "
                "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8, 1>(T1 *, long, T1 *, const T1 *, "
                "float, int, int)")
    assert kernel_base(nsys) == kernel_base(ncu_name) == "fused_add_rms_norm_kernel"
    assert kernel_base("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, "
                       "long, unsigned int, 2, 2, -2>(cuda::detail::TensorInfo<T1, T3>, int)") \
        == "indexSelectSmallIndex"
    assert kernel_base("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>("
                       "at::native::ReduceOp<float>)") == "reduce_kernel"
    assert kernel_base("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT") == "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
