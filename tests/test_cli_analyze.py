"""`stepscope analyze`: the JSON contract and one clean line for every kind of bad input."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from tests.conftest import EXTERNAL, FIXTURES, need, ro, sha256

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"


def run_cli(*args, real: bool = False):
    """Exit code, stdout, stderr of the command line: through main()'s error boundary in this
    process (an exception past it fails here), or with `real` the real entry point in a
    subprocess (tracebacks show on its stderr); one case of each kind below takes the real one."""
    if real:
        p = subprocess.run([sys.executable, "-m", "stepscope", *map(str, args)], capture_output=True, text=True,
                           timeout=120)
        return p.returncode, p.stdout, p.stderr
    r = CliRunner().invoke(app, [*map(str, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.stdout, r.stderr


def test_json_contract_on_real_trace():
    before = sha256(need(EAGER))
    r = CliRunner().invoke(app, ["analyze", str(EAGER), "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert set(doc) == {"trace", "gpus", "warnings", "steps", "whatif_calibration"}
    assert doc["trace"]["nsys_version"] == "2025.3.2.0" and doc["trace"]["schema_version"] == "3.20.3"
    assert doc["gpus"][0]["name"] == "NVIDIA H200"
    step = doc["steps"][0]
    for key in ("index", "pid", "device", "delimiter", "name", "step_time_ns", "n_kernels", "kernel_time_sum_ns",
                "gpu_busy_ns", "gpu_span_ns", "idle_ns", "n_launch_calls", "launch_call_ns", "layers",
                "kernels_per_layer", "classes", "kernels"):
        assert key in step
    n_sql = ro(EAGER).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert step["n_kernels"] == n_sql == 420
    assert sum(c["count"] for k, c in step["classes"].items() if k != "memops") == n_sql
    assert sum(k["count"] for k in step["kernels"] if k["class"] != "memops") == n_sql
    assert isinstance(step["pid"], int) and all(isinstance(step[k], int) for k in ("step_time_ns", "idle_ns"))
    assert sha256(EAGER) == before


def test_steps_option():
    path = need(EXTERNAL / "pipit_cloverleaf.sqlite")
    first = json.loads(CliRunner().invoke(app, ["analyze", str(path), "--json", "--steps", "first"]).stdout)
    assert [s["index"] for s in first["steps"]] == [0]
    third = json.loads(CliRunner().invoke(app, ["analyze", str(path), "--json", "--steps", "3"]).stdout)
    assert [s["index"] for s in third["steps"]] == [3]
    every = json.loads(CliRunner().invoke(app, ["analyze", str(path), "--json"]).stdout)
    assert len(every["steps"]) == 10
    # the grammar every --steps shares (stepscope.selection): ranges and lists
    some = json.loads(CliRunner().invoke(app, ["analyze", str(path), "--json", "--steps", "2-3,7"]).stdout)
    assert [s["index"] for s in some["steps"]] == [2, 3, 7]
    assert some["steps"][0] == every["steps"][2]


def test_default_is_the_bundled_trace():
    code, out, err = run_cli("analyze", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["trace"]["path"].endswith("default.sqlite")
    assert doc["steps"][0]["floors"]["verdict"] == "launch-bound"


def test_terminal_report_names_the_verdict():
    code, out, err = run_cli("analyze", EAGER, real=True)
    assert code == 0 and err == ""
    assert "launch-bound" in out and "coverage: 100.0%" in out and "32 layers × 13 kernels" in out
    verdict = " ".join(out[out.index("Verdict:"):].split("step time")[0].split())
    assert verdict.startswith("Verdict: decode step is launch-bound (29.868 ms; ≈ 22.281 ms untraced, "
                              "estimated); CUDA graphs would cut it")
    assert "gemm holds 84% of GPU time" in verdict


def _bad(tmp_path, kind):
    p = tmp_path / f"{kind}.sqlite"
    if kind == "text":
        p.write_text("definitely not a database\n")
    elif kind == "truncated":
        p.write_bytes(need(EAGER).read_bytes()[:50_000])
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "nokernels":
        shutil.copy(need(EAGER), p)
        con = sqlite3.connect(p)
        con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
        con.commit()
        con.close()
    return p


@pytest.mark.parametrize("kind,message", [
    ("text", "is not a SQLite file"),
    ("empty", "is not a SQLite file"),
    ("truncated", "truncated"),
    ("nokernels", "--trace=cuda"),
])
def test_bad_files_one_line_exit_2_untouched(tmp_path, kind, message):
    p = _bad(tmp_path, kind)
    before = sha256(p)
    code, out, err = run_cli("analyze", p, real=kind == "truncated")
    assert code == 2
    assert out == "" and len(err.strip().splitlines()) == 1 and message in err
    assert "Traceback" not in err
    assert sha256(p) == before


SAXPY = EXTERNAL / "pipit_saxpy_2022.sqlite"  # a foreign export: steps only from its MPI ranges
NEEDS_SAXPY = pytest.mark.skipif(not SAXPY.exists(), reason=f"{SAXPY} not present")


@pytest.mark.parametrize("args,message", [
    (["analyze", "/nonexistent/trace.sqlite"], "no such file"),
    pytest.param(["analyze", str(SAXPY), "--step-regex", "^MPI_Init$"], "no step found", marks=NEEDS_SAXPY),
    pytest.param(["analyze", str(SAXPY), "--step-regex", "(("], "bad --step-regex", marks=NEEDS_SAXPY),
    (["analyze", str(EAGER), "--step-regex", "(("], "bad --step-regex"),
    (["analyze", str(EAGER), "--steps", "lots"], "--steps takes"),
    (["analyze", str(EAGER), "--steps", "7"], "no step 7"),
])
def test_bad_arguments_one_line_exit_2(args, message):
    code, out, err = run_cli(*args, real=message == "no such file")
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_bad_rules_file(tmp_path):
    f = tmp_path / "rules.toml"
    f.write_text('[[rule]]\nclass = "gemm"\npattern = "nvjet[("\n')
    code, out, err = run_cli("analyze", EAGER, "--rules", f)
    assert code == 2 and "bad regex" in err and "Traceback" not in err
