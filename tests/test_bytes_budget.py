"""Byte budget: joining step kernels to cells, the step total, bad inputs."""

import json

import polars as pl
import pytest
from tests.conftest import CliRunner

from stepscope.bytes.budget import budget, kernel_base
from stepscope.bytes.minbytes import step_min_bytes
from stepscope.errors import InputError
from tests.conftest import EXTERNAL, need

DIM1 = dict(grid_y=1, grid_z=1, block_y=1, block_z=1)


def cell(cell, op, proj, tokens, kernel, gx, bx, rd, wr, gpu="NVIDIA H200"):
    return dict(gpu=gpu, cell=cell, op=op, proj=proj, tokens=tokens, kernel=kernel, grid_x=gx,
                block_x=bx, dram_read_bytes=rd, dram_write_bytes=wr, matched=True, error=None,
                **DIM1)


CELLS = pl.DataFrame([
    cell("gemm_qkv_m1", "gemm", "qkv", 1, "nvjet_tst_a_TNT", 132, 384, 50_400_000, 12_288),
    cell("gemm_down_m1", "gemm", "down", 1, "nvjet_tst_b_TNT", 132, 384, 117_500_000, 8_192),
    cell("gemm_down_m1", "gemm", "down", 1,
         "void cublasLt::splitKreduce_kernel<32, 16, int, float>(float const*)", 4, 128,
         300_000, 8_192),
    cell("add_norm_m1", "add_norm", None, 1, "fused_add_rms_norm_kernel", 1, 128, 30_000, 16_384),
    cell("add_norm_m64", "add_norm", None, 64, "fused_add_rms_norm_kernel", 64, 128, 1e6, 1e6),
    cell("rope_m64", "rope", None, 64, "rotary_embedding_kernel", 64, 128, 900_000, 700_000),
    cell("argmax_m1", "argmax", None, 1,
         "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
         "at::native::ArgMaxOps<float>, unsigned int, long, 4> >(T3)", 1, 512, 513_000, 0),
])


def kern(name, cls, gx, bx, count, t, demangled=None):
    return dict(name=name, demangled=demangled or name, **{"class": cls}, grid_x=gx, block_x=bx,
                count=count, time_ns=t, **DIM1)


STEP = pl.DataFrame([
    kern("nvjet_tst_a_TNT", "gemm", 132, 384, 32, 640_000),                   # launch join
    kern("nvjet_tst_b_TNT", "gemm", 132, 384, 32, 1_200_000),
    kern("splitKreduce_kernel", "splitk_reduce", 4, 128, 32, 64_000,
         "void cublasLt::splitKreduce_kernel<32, 16, int, float>(float const*)"),
    kern("fused_add_rms_norm_kernel", "norm", 1, 128, 64, 128_000),           # nearest tokens
    kern("rotary_embedding_kernel", "rope", 1, 128, 32, 64_000),              # name only
    kern("reduce_kernel", "sampling", 1, 512, 1, 46_000,
         "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
         "at::native::ArgMaxOps<float>, unsigned int, long, 4> >(T3)"),
    kern("elementwise_kernel", "framework", 1, 128, 5, 5_000),                # no cell
])


def test_kernel_base():
    assert kernel_base("void at::native::reduce_kernel<512, 1, X<a, b> >(T3)") == "reduce_kernel"
    assert kernel_base("at::cuda::<unnamed>::spin_kernel(long)") == "spin_kernel"
    assert kernel_base("nvjet_tst_a_TNT") == "nvjet_tst_a_TNT"


def test_joins_and_step_total():
    r = budget(STEP, CELLS, "llama-3.1-8b", 1, 2048, "decode", "NVIDIA H200")
    k = {row["name"]: row for row in r.kernels.to_dicts()}
    assert k["nvjet_tst_a_TNT"]["join"] == "launch" and k["nvjet_tst_a_TNT"]["op"] == "gemm:qkv"
    assert k["nvjet_tst_a_TNT"]["measured_bytes"] == 32 * (50_400_000 + 12_288)
    assert k["splitKreduce_kernel"]["join"] == "launch"
    assert k["splitKreduce_kernel"]["op"] == "gemm:down"
    assert k["fused_add_rms_norm_kernel"]["cell"] == "add_norm_m1"  # nearest token count wins
    assert k["rotary_embedding_kernel"]["join"] == "name"
    assert k["reduce_kernel"]["join"] == "launch" and k["reduce_kernel"]["op"] == "argmax"
    assert k["elementwise_kernel"]["join"] is None
    st = r.step
    assert [u["name"] for u in st["unjoined_kernels"]] == ["elementwise_kernel"]
    assert st["measured_bytes"] == sum(v["measured_bytes"] or 0 for v in k.values())
    assert st["measured_bytes"] == r.rows["measured_bytes"].fill_null(0).sum()
    # measured and minimum over the same kernels: the ops this partial step joined (qkv, down,
    # add_norm, rope, argmax); the whole step's minimum is kept beside it
    from stepscope.bytes.minbytes import step_rows

    plan = {r["op"]: r["min_bytes"] for r in step_rows("llama-3.1-8b", 1, 2048, "decode")}
    joined_ops = sorted(set(r.rows.filter(pl.col("measured_bytes").is_not_null() & pl.col("op").is_not_null())["op"]))
    assert joined_ops == ["add_norm", "argmax", "gemm:down", "gemm:qkv", "rope"]
    assert st["min_bytes"] == sum(plan[o] for o in joined_ops)
    assert st["plan_min_bytes"] == step_min_bytes("llama-3.1-8b", 1, 2048, "decode")
    assert st["unjoined_min_bytes"] == st["plan_min_bytes"] - st["min_bytes"]
    assert set(st["unjoined_ops"]) == set(plan) - set(joined_ops)
    assert 1 < st["amplification"] < 1.1  # the subset's bytes against the subset's minimum
    assert st["removable_bytes"] == st["measured_bytes"] - st["min_bytes"]
    assert r.peak_bps == 4.8e12
    assert st["floor_ns"] == int(st["measured_bytes"] / 4.8e12 * 1e9)
    qkv = r.rows.filter(pl.col("op") == "gemm:qkv").row(0, named=True)
    assert qkv["calls"] == 32 and qkv["min_bytes"] == 32 * (4096 * 6144 + 4096 + 6144) * 2
    assert qkv["removable_bytes"] == qkv["measured_bytes"] - qkv["min_bytes"]
    assert r.classes["class"][0] in set(r.classes["class"])  # ranked frame exists
    assert any("no cell" in w for w in r.warnings)


def test_other_gpu_is_refused():
    with pytest.raises(InputError, match="not on NVIDIA H100"):
        budget(STEP, CELLS, "llama-3.1-8b", 1, 2048, "decode", "NVIDIA H100 80GB HBM3")


def test_missing_columns():
    with pytest.raises(InputError, match="grid_x"):
        budget(STEP.drop("grid_x"), CELLS, "llama-3.1-8b", 1, 2048, "decode")


def test_budget_command_on_a_foreign_trace(tmp_path):
    trace = need(EXTERNAL / "nsysai_h100_2gpu_1s.sqlite")
    from stepscope.cli import app

    cells_path = tmp_path / "c.parquet"
    CELLS.drop("gpu").with_columns(pl.lit(None, pl.String).alias("gpu")).write_parquet(cells_path)
    runner = CliRunner()
    r = runner.invoke(app, ["budget", str(trace), "--cells", str(cells_path)])
    assert r.exit_code != 0 and "--model" in r.output  # no NVTX step shape in this trace
    r = runner.invoke(app, ["budget", str(trace), "--cells", str(cells_path), "--model",
                            "llama-3.1-8b", "--batch", "1", "--context", "2048", "--phase",
                            "decode", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    for key in ("measured_bytes", "min_bytes", "removable_bytes", "unjoined_kernels"):
        assert key in d["step"]
    assert d["step"]["unjoined_kernels"]  # every kernel joined or explicitly listed
    n_listed = sum(u["count"] for u in d["step"]["unjoined_kernels"])
    assert n_listed + sum(d["step"]["joined"].values()) == d["step"]["calls"]
