"""`stepscope cells import/show/run` through typer's CliRunner: good and bad inputs."""

import json
from pathlib import Path

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app

DATA = Path(__file__).parent / "bytes_data"
FAKE_NCU = str(Path(__file__).parent / "bytes_fake_ncu.py")
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["cells", *map(str, args)])


def test_import_then_show(tmp_path):
    out = tmp_path / "cells.parquet"
    r = invoke("import", DATA / "ncu_raw_sample.csv", DATA / "ncu_raw_base_units.csv",
               "-o", out, "--gpu", "NVIDIA H200")
    assert r.exit_code == 0, r.output
    assert out.exists() and (tmp_path / "cells.csv").exists()
    r = invoke("show", out, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["gpus"] == ["NVIDIA H200"] and d["peak_hbm_bps"] == 4.8e12
    assert len(d["cells"]) == 6  # one entry per profiled launch
    first = d["cells"][0]
    for k in ("kernel", "grid", "block", "dram_read_bytes", "dram_write_bytes", "duration_ns"):
        assert k in first
    assert first["dram_read_bytes"] == 113_930_000
    r = invoke("show", tmp_path / "cells.csv", "--json")  # the CSV twin reads the same
    assert r.exit_code == 0 and json.loads(r.stdout) == d
    r = invoke("show", out)
    assert r.exit_code == 0 and "byte cells — NVIDIA H200" in r.stdout


def test_show_reads_raw_ncu_csv_directly():
    r = invoke("show", DATA / "ncu_raw_base_units.csv", "--json")
    assert r.exit_code == 0, r.output
    assert [c["dram_read_bytes"] for c in json.loads(r.stdout)["cells"]][1] == 1_050_812_416


@pytest.mark.parametrize("name,msg", [
    ("ncu_no_dram.csv", "dram__bytes_read.sum"),
    ("ncu_empty.csv", "empty"),
    ("ncu_perm.csv", "ERR_NVGPUCTRPERM"),
    ("missing.csv", "no such file"),
])
@pytest.mark.parametrize("cmd", ["import", "show"])
def test_bad_inputs_one_line_no_traceback(tmp_path, name, msg, cmd):
    extra = ["-o", tmp_path / "c.parquet"] if cmd == "import" else []
    r = invoke(cmd, DATA / name, *extra)
    assert r.exit_code != 0
    assert msg in r.output
    assert "Traceback" not in r.output and r.exception is None or isinstance(
        r.exception, SystemExit)


def test_show_rejects_a_non_cells_parquet(tmp_path):
    import polars as pl

    p = tmp_path / "x.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(p)
    r = invoke("show", p)
    assert r.exit_code != 0 and "not a cells table" in r.output


def test_run_with_fake_ncu(tmp_path):
    r = invoke("run", "--smoke", "--ncu", FAKE_NCU, "--out", tmp_path)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cells.parquet").exists() and (tmp_path / "ncu_raw.csv").exists()
    assert "3/3 cells measured on NVIDIA H200" in r.output


def test_run_without_ncu(tmp_path, monkeypatch):
    from stepscope.bytes import sweep

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("STEPSCOPE_NCU", raising=False)
    monkeypatch.setattr(sweep, "NCU_FALLBACKS", ())
    r = invoke("run", "--smoke", "--out", tmp_path / "o")
    assert r.exit_code != 0 and "ncu" in r.output and "Traceback" not in r.output


def test_run_print_commands():
    r = invoke("run", "--cell", "gemm_qkv_m2048", "--print-commands", "--ncu", "ncu")
    assert r.exit_code == 0
    assert "-k regex:" in r.stdout and "--launch-count 2" in r.stdout
    r = invoke("run", "--cell", "nope", "--print-commands")
    assert r.exit_code != 0 and "no cell nope" in r.output
