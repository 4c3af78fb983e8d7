"""PyTorch-profiler (Kineto) traces → the same Trace model and the same per-step figures."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from tests.conftest import CliRunner

from stepscope.analysis.inventory import analyze_trace
from stepscope.cli import app
from stepscope.errors import InputError
from stepscope.ingest import read_trace
from stepscope.ingest.kineto import ns, read_kineto
from tests import kineto_fake
from tests.conftest import FIXTURES

PROFILER_STEP = r"^ProfilerStep#\d+$"
REAL = sorted((FIXTURES / "torch_profiler").glob("*.json.gz")) if (FIXTURES / "torch_profiler").is_dir() else []


def test_ns_exact_from_decimal_text():
    assert ns("5189949600768.645") == 5189949600768645
    assert ns("1.0005") == 1001  # half up on the sub-ns digit
    assert ns("50.433") == 50433
    assert ns(12) == 12000
    assert ns("1e-3") == 1
    assert ns("-2.5") == -2500


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_handmade_trace_reads_into_the_model(tmp_path, suffix):
    path = kineto_fake.write(tmp_path / f"t{suffix}")
    t = read_trace(path)  # dispatch on content, not name
    assert t.format == "kineto-json"
    assert t.kernels.height == 12 and t.memops.height == 3
    assert t.api.height == 3 * 5 + 1
    # the step annotations, and the cpu_op events as op ranges (one aten::mm per step)
    assert t.nvtx["name"].to_list() == ["ProfilerStep#0", "aten::mm", "ProfilerStep#1", "aten::mm", "ProfilerStep#2", "aten::mm"]
    # GPU rows carry the launching process, not Kineto's device-as-pid
    assert t.kernels["pid"].unique().to_list() == [kineto_fake.PID]
    assert t.kernels["device"].unique().to_list() == [0] and t.kernels["stream"].unique().to_list() == [7]
    k = t.kernels.sort("start").row(0, named=True)
    assert k["start"] == (kineto_fake.BASE_US + 10) * 1000 + 1 and k["end"] - k["start"] == 5000
    assert (k["grid_x"], k["grid_y"], k["block_x"]) == (132, 1, 256)
    assert k["short_id"] == k["demangled_id"]
    names = t.string_map()
    assert names[k["short_id"]] == kineto_fake.KERNELS[0]
    assert t.memops["bytes"].to_list() == [4096] * 3
    assert t.gpus.row(0, named=True)["sm_count"] == 132
    assert t.processes["name"].to_list() == ["python"]


def test_handmade_trace_step_figures_by_hand(tmp_path):
    inv = analyze_trace(read_kineto(kineto_fake.write(tmp_path / "t.json")), PROFILER_STEP)
    inv.self_check()
    s = inv.steps
    assert s["delimiter"].unique().to_list() == ["nvtx"]
    assert s["n_kernels"].to_list() == [4, 4, 4]
    assert s["kernel_time_sum_ns"].to_list() == [20_000] * 3
    assert s["gpu_span_ns"].to_list() == [31_499] * 3      # 10.001 µs → 41.500 µs
    assert s["gpu_busy_ns"].to_list() == [21_500] * 3      # 4 × 5 µs + 1.5 µs memcpy
    assert s["idle_ns"].to_list() == [9_999] * 3
    c = inv.classes.filter(pl.col("step") == 0)
    assert dict(zip(c["class"], c["count"])) == {"gemm": 1, "norm": 1, "framework": 1, "comm": 1, "memops": 1}


def test_handmade_trace_launch_calls_by_hand(tmp_path):
    inv = analyze_trace(read_kineto(kineto_fake.write(tmp_path / "t.json")), PROFILER_STEP)
    s = inv.steps
    assert s["n_launch_calls"].to_list() == [4, 4, 4]      # cudaLaunchKernel; the memcpy is no launch
    assert s["launch_call_ns"].to_list() == [5_000] * 3


def test_analyze_cli_on_kineto(tmp_path):
    path = kineto_fake.write(tmp_path / "t.json.gz")
    r = CliRunner().invoke(app, ["analyze", str(path), "--step-regex", PROFILER_STEP, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [s["n_kernels"] for s in doc["steps"]] == [4, 4, 4]


def test_not_a_kineto_trace(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"hello": [1, 2, 3]}')
    with pytest.raises(InputError, match="not a PyTorch-profiler"):
        read_trace(p)
    r = CliRunner().invoke(app, ["analyze", str(p)])
    assert r.exit_code != 0
    assert r.output.count("\n") == 1 and "not a PyTorch-profiler" in r.output


def test_kineto_without_kernels(tmp_path):
    p = tmp_path / "cpu.json"
    doc = kineto_fake.document()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy")]
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="no GPU kernel events"):
        read_trace(p)


def test_truncated_gzip_and_truncated_json(tmp_path):
    good = gzip.compress(json.dumps(kineto_fake.document()).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(good[: len(good) // 2])
    with pytest.raises(InputError, match="truncated gzip"):
        read_trace(p)
    r = CliRunner().invoke(app, ["analyze", str(p)])
    assert r.exit_code != 0 and "truncated" in r.output and "Traceback" not in r.output
    q = tmp_path / "cut.json"
    q.write_text(json.dumps(kineto_fake.document())[:5000])
    with pytest.raises(InputError, match="not valid JSON"):
        read_trace(q)


@pytest.mark.skipif(not REAL, reason="no committed torch.profiler trace under fixtures/torch_profiler/ yet")
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_torch_profiler_trace(path):
    t = read_trace(path)
    assert t.format == "kineto-json" and t.kernels.height > 0 and t.api.height > 0
    # every kernel joins to its launching call on (pid, correlation)
    joined = t.kernels.join(t.api, on=["pid", "corr"], how="semi").height
    assert joined / t.kernels.height > 0.99
    inv = analyze_trace(t)
    inv.self_check()
    assert inv.steps["delimiter"].unique().to_list() == ["nvtx"]
    assert inv.steps["n_kernels"].n_unique() == 1  # identical decode steps


def test_torch_profiler_and_nsys_agree_on_the_same_step():
    """The same torch-engine decode step on the same 2×H200 machine, once under nsys and once
    under torch.profiler: identical kernel counts per class; the raw kernel counts per step
    are read independently (json for Kineto, SQL for nsys)."""
    from stepscope.api import open_trace
    from tests.conftest import need, ro

    kin_path = need(FIXTURES / "torch_profiler" / "llama8b_decode_b1_eager_x2.torch.json.gz")
    nsys_path = need(FIXTURES / "llama8b_decode_b1_eager_x2.sqlite")
    kin, nsys = open_trace(kin_path), open_trace(nsys_path)
    n_sql = ro(nsys_path).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    events = json.loads(gzip.decompress(kin_path.read_bytes()))["traceEvents"]
    n_json = sum(1 for e in events if e.get("cat") == "kernel")
    assert kin.table.height == 3 and n_json == 3 * n_sql  # three profiled steps
    want = dict(zip(nsys.steps[0].classes["class"], nsys.steps[0].classes["count"]))
    for step in kin.steps:
        assert dict(zip(step.classes["class"], step.classes["count"])) == want


def test_cpu_ops_attribute_framework_kernels_to_their_aten_op(tmp_path):
    """torch.profiler's cpu_op events are the aten:: ops around each launch (what emit_nvtx
    writes under nsys): a framework kernel is attributed to the outermost op that launched it.
    A real trace with one GEMM renamed to an elementwise add: its op is the aten::linear whose
    CPU span holds its launching call."""
    from stepscope.api import open_trace

    src = FIXTURES / "torch_profiler" / "llama8b_decode_b1_eager.torch.json.gz"
    if not src.exists():
        pytest.skip(f"{src} not present")
    doc = json.load(gzip.open(src))
    ev = doc["traceEvents"]
    ops = [e for e in ev if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    linear = [o for o in ops if o["name"] == "aten::linear"]
    kernel = next(k for k in ev if k.get("cat") == "kernel" and k["args"].get("correlation") in calls
                  and any(o["tid"] == calls[k["args"]["correlation"]]["tid"]
                          and float(o["ts"]) <= float(calls[k["args"]["correlation"]]["ts"])
                          <= float(o["ts"]) + float(o["dur"]) for o in linear))
    kernel["name"] = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)"
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(doc, f)
    inv = open_trace(p).inventory
    assert inv.trace.nvtx.filter(pl.col("name").str.starts_with("aten::")).height > 1000
    fw = inv.framework_ops
    assert fw.filter(pl.col("op") == "aten::linear")["count"].sum() == 1
