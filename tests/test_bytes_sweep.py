"""Sweep definition, ncu command lines, and the runner against a stand-in ncu (no GPU)."""

from pathlib import Path

import pytest

from stepscope.bytes import sweep as sw
from stepscope.bytes.cells import frame, ledger, read_cells, write_cells
from stepscope.errors import EnvironmentProblem, InputError

FAKE_NCU = str(Path(__file__).parent / "bytes_fake_ncu.py")


@pytest.fixture(scope="module")
def default():
    return sw.load_sweep()


def test_default_sweep_has_every_cell(default):
    names = [c["cell"] for c in default.cells]
    assert len(names) == 52 == len(set(names))
    for proj in ("qkv", "o", "gate_up", "down", "lm_head"):
        for m in (1, 64, 256, 2048):
            assert f"gemm_{proj}_m{m}" in names
    assert {"attn_prefill_m1024", "attn_prefill_m2048", "attn_prefill_m4096",
            "attn_decode_b64_ctx2048"} <= set(names)
    for op in ("norm", "add_norm", "rope", "kv_write", "silu_mul", "embedding", "argmax"):
        assert all(f"{op}_m{m}" in names for m in (1, 64, 256, 2048))
    assert default.metrics[:2] == ["dram__bytes_read.sum", "dram__bytes_write.sum"]
    assert default.warmups == 10 and default.launch_count == 2
    assert 2 <= len(default.smoke) <= 3


def test_cell_command_for_every_cell(default):
    for spec in default.cells:
        cmd = sw.cell_command("/x/ncu", default, spec, python="python3")
        assert cmd[0] == "/x/ncu"
        i = cmd.index("-k")
        assert cmd[i + 1] == "regex:" + default.regex[spec["op"]]
        assert cmd[cmd.index("--launch-count") + 1] == "2"
        assert cmd[cmd.index("--profile-from-start") + 1] == "off"
        assert cmd[cmd.index("--clock-control") + 1] == "none"
        assert cmd[cmd.index("--metrics") + 1].split(",") == default.metrics
        assert cmd[cmd.index("--page") + 1] == "raw" and "--csv" in cmd
        j = cmd.index("python3")
        assert cmd[j:j + 3] == ["python3", "-m", "stepscope.bytes.sentinel"]
        assert cmd[cmd.index("--op") + 1] == spec["op"]
        assert cmd[cmd.index("--m") + 1] == str(spec["m"])
        assert cmd[cmd.index("--warmups") + 1] == "10"
        if spec["op"] == "gemm":
            assert cmd[cmd.index("--proj") + 1] == spec["proj"]
    qkv = default.select(["gemm_qkv_m2048"])[0]
    cmd = sw.cell_command("ncu", default, qkv, model="llama-3.1-8b", python="python")
    assert cmd[cmd.index("python"):] == [
        "python", "-m", "stepscope.bytes.sentinel", "--model", "llama-3.1-8b", "--warmups",
        "10", "--op", "gemm", "--m", "2048", "--proj", "qkv"]


def test_batch_command_has_no_kernel_filter(default):
    cmd = sw.batch_command("ncu", default, "c.json", "m.jsonl", python="py")
    assert "-k" not in cmd and "--launch-count" not in cmd
    assert cmd[-5:] == ["--cells", "c.json", "--marker", "--manifest", "m.jsonl"]


def test_bad_sweeps(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("name = 'x'\n")
    with pytest.raises(InputError, match="no \\[\\[cells\\]\\]"):
        sw.load_sweep(p)
    p.write_text("[[cells]]\nop = 'conv'\nm = 1\n")
    with pytest.raises(InputError, match="unknown op"):
        sw.load_sweep(p)
    p.write_text("[[cells]]\nop = 'norm'\nm = 1\n")
    with pytest.raises(InputError, match="regex"):
        sw.load_sweep(p)
    p.write_text("[regex]\nnorm='('\n[[cells]]\nop = 'norm'\nm = 1\n")
    with pytest.raises(InputError, match="bad regex"):
        sw.load_sweep(p)
    p.write_text("not toml [")
    with pytest.raises(InputError, match="TOML"):
        sw.load_sweep(p)
    with pytest.raises(InputError, match="does not exist"):
        sw.load_sweep(tmp_path / "missing.toml")


def test_custom_sweep_expands_lists(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("metrics=['dram__bytes_read.sum','dram__bytes_write.sum']\n"
                 "[regex]\ngemm='gemm'\nnorm='norm'\n"
                 "[[cells]]\nop='gemm'\nproj=['qkv','o']\nm=[1,8]\n"
                 "[[cells]]\nop='norm'\nm=4\n")
    s = sw.load_sweep(p)
    assert [c["cell"] for c in s.cells] == ["gemm_qkv_m1", "gemm_qkv_m8", "gemm_o_m1",
                                             "gemm_o_m8", "norm_m4"]
    with pytest.raises(InputError, match="no cell"):
        s.select(["gemm_down_m1"])


def test_assign_launches_cuts_at_markers():
    specs = [{"cell": "a"}, {"cell": "b"}, {"cell": "c"}]
    manifest = [{"cell": "a", "marker": True}, {"cell": "b", "marker": False},
                {"cell": "c", "marker": True}]
    launches = [{"id": i, "pid": 1, "kernel": k} for i, k in enumerate(
        ["at::cuda::<unnamed>::spin_kernel(long)", "gemm1", "splitKreduce_kernel",
         "at::cuda::<unnamed>::spin_kernel(long)", "rms_norm_kernel"])]
    got = sw.assign_launches(launches, specs, manifest, batched=True)
    assert [d["kernel"] for d in got["a"]] == ["gemm1", "splitKreduce_kernel"]
    assert got["b"] == []  # failed before opening its range
    assert [d["kernel"] for d in got["c"]] == ["rms_norm_kernel"]


@pytest.mark.parametrize("per_process", [0, 13, 1])
def test_run_sweep_with_fake_ncu(tmp_path, default, per_process):
    cells = None if per_process != 1 else ["gemm_qkv_m2048", "norm_m64", "argmax_m2048"]
    res = sw.run_sweep(default, tmp_path, ncu=FAKE_NCU, cells_per_process=per_process,
                       cells=cells, progress=False)
    n = 52 if cells is None else 3
    df = frame(res.rows)
    assert df["cell"].n_unique() == n
    assert res.failed == ["argmax_m2048"]  # the stand-in fails this one; the rest go on
    assert res.gpu == "NVIDIA H200"
    bad = df.filter(df["cell"] == "argmax_m2048")
    assert bad.height == 1 and "boom" in bad["error"][0]
    ok = df.filter(df["cell"] == "gemm_qkv_m2048")
    assert ok["dram_read_bytes"].to_list() == [2_048_000] and ok["matched"].to_list() == [True]
    assert ok["cell_min_bytes"][0] == 92_274_688
    assert "spin_kernel" not in " ".join(df["kernel"].drop_nulls().to_list())
    paths = write_cells(df, tmp_path / "cells")
    back = read_cells(paths[0])
    assert back.height == df.height and back["gpu"].unique().to_list() == ["NVIDIA H200"]
    assert read_cells(paths[1]).height == df.height
    led = ledger(back)
    amp = led.filter(led["cell"] == "gemm_qkv_m2048")["amplification"][0]
    assert amp == pytest.approx((2_048_000 + 20_480) / 92_274_688)


def test_deadline_skips_later_cells(tmp_path, default):
    res = sw.run_sweep(default, tmp_path, ncu=FAKE_NCU, cells_per_process=13, progress=False,
                       deadline_s=0)
    df = frame(res.rows)
    assert df["error"].str.contains("deadline").all()


def test_ncu_missing(monkeypatch, tmp_path, default):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sw, "NCU_FALLBACKS", ())
    monkeypatch.delenv("STEPSCOPE_NCU", raising=False)
    with pytest.raises(EnvironmentProblem, match="ncu"):
        sw.find_ncu()
    with pytest.raises(EnvironmentProblem, match="not found"):
        sw.find_ncu(str(tmp_path / "ncu"))


def test_counter_permission_stops_the_sweep(monkeypatch, tmp_path, default):
    monkeypatch.setenv("FAKE_NCU_MODE", "perm")
    with pytest.raises(EnvironmentProblem, match="ERR_NVGPUCTRPERM"):
        sw.run_sweep(default, tmp_path, ncu=FAKE_NCU, cells=default.smoke, progress=False)


def test_missing_metrics_marks_cells_failed(monkeypatch, tmp_path, default):
    monkeypatch.setenv("FAKE_NCU_MODE", "nometrics")
    res = sw.run_sweep(default, tmp_path, ncu=FAKE_NCU, cells=default.smoke, progress=False)
    assert sorted(res.failed) == sorted(default.smoke)
    assert all("dram__bytes" in r["error"] for r in res.rows)
