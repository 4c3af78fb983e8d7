"""`stepscope trace` / `doctor` on a machine without a GPU: bad input and failures give one
clear line and a non-zero exit (no traceback); the orchestration runs end to end against a
fake nsys and a fake nvidia-smi."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.capture import doctor, run
from stepscope.capture.run import TraceRequest
from stepscope.errors import EnvironmentProblem, InputError

from tests.conftest import EXTERNAL, FIXTURES, ROOT
SHIM = run.CLI_SHIM


def cli(*args: str, env: dict | None = None, cwd: Path | None = None):
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", SHIM, *args], capture_output=True, text=True,
                          env=e, cwd=cwd or ROOT, timeout=300)


def inproc(*args: str, env: dict | None = None):
    """The same command line through main()'s error boundary in this process (a CompletedProcess
    like cli's): the checks that import torch, which the real entry point's cases above and
    below need not import again."""
    from tests.conftest import CliRunner

    from stepscope.cli import app

    r = CliRunner().invoke(app, list(args), env=env)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def one_error_line(cp) -> str:
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert "Traceback" not in cp.stderr
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, cp.stderr
    assert lines[0].startswith("stepscope: error: ")
    return lines[0]


NO_GPU_PATH = {"PATH": "/usr/bin:/bin"}  # no nvidia-smi, no nsys


def test_unknown_model():
    line = one_error_line(cli("trace", "--model", "gpt-17"))
    assert "unknown model 'gpt-17'" in line and "llama-3.1-8b" in line


def test_vllm_missing():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM installed")
    line = one_error_line(cli("trace", "--engine", "vllm", "--model", "llama-3.2-1b"))
    assert "vLLM" in line and "not installed" in line and "--engine torch" in line


def test_bad_numbers_and_choices():
    assert "--batch must be at least 1" in one_error_line(cli("trace", "--batch", "0"))
    assert "unknown phase" in one_error_line(cli("trace", "--phase", "chat"))
    assert "unknown mode" in one_error_line(cli("trace", "--mode", "fast"))
    assert "unknown engine" in one_error_line(cli("trace", "--engine", "trt"))
    line = one_error_line(cli("trace", "--engine", "torch", "--tp", "3"))
    assert "--tp 3 does not divide" in line


def test_no_gpu_says_capture_needs_a_gpu():
    line = one_error_line(inproc("trace", "--engine", "torch", env=NO_GPU_PATH))
    assert "capture needs an NVIDIA GPU" in line


def test_preflight_tp_wider_than_gpus(monkeypatch):
    monkeypatch.setattr(run, "gpu_count", lambda: (1, "test"))
    with pytest.raises(InputError, match="--tp 2 needs 2 GPUs but this machine has 1"):
        run.preflight(TraceRequest(model="llama-3.1-8b", engine="torch", tp=2))


def test_preflight_nsys_missing(monkeypatch):
    monkeypatch.setattr(run, "gpu_count", lambda: (1, "test"))
    monkeypatch.setattr(run.nsys_mod, "discover", lambda *a, **k: None)
    with pytest.raises(EnvironmentProblem, match="nsys .* not found"):
        run.preflight(TraceRequest(model="llama-3.1-8b", engine="torch"))


def test_preflight_importer_broken(monkeypatch, tmp_path):
    monkeypatch.setattr(run, "gpu_count", lambda: (1, "test"))
    imp = tmp_path / "QdstrmImporter"
    imp.write_text("#!/bin/sh\necho 'error while loading shared libraries: libdw.so.1: x' >&2\n"
                   "exit 127\n")
    imp.chmod(0o755)
    cand = run.nsys_mod.NsysCandidate(path=tmp_path / "nsys", source="test", importer=imp)
    monkeypatch.setattr(run.nsys_mod, "discover", lambda *a, **k: cand)
    with pytest.raises(EnvironmentProblem) as e:
        run.preflight(TraceRequest(model="llama-3.1-8b", engine="torch"))
    assert "cannot load libdw.so.1" in str(e.value) and "libdw1" in str(e.value)


# --- doctor ----------------------------------------------------------------------------------
def test_doctor_on_this_cpu_box(monkeypatch):
    monkeypatch.setattr(doctor, "check_gpus",
                        lambda: {"ok": False, "count": 0, "gpus": [], "nvidia_smi": False})
    d = doctor.diagnose()
    assert d["can_capture"] is False
    assert "capture needs an NVIDIA GPU" in d["verdict"]
    for key in ("nsys", "ncu", "gpus", "torch", "triton", "vllm"):
        assert key in d


def test_doctor_command_plain_and_json():
    cp = inproc("doctor", env=NO_GPU_PATH)
    assert cp.returncode == 0, cp.stderr
    out = " ".join(cp.stdout.split())
    for word in ("nsys", "ncu", "GPUs", "torch", "vLLM"):
        assert word in out
    assert "capture needs an NVIDIA GPU" in out
    cp = inproc("doctor", "--json", env=NO_GPU_PATH)
    d = json.loads(cp.stdout)
    assert d["can_capture"] is False and d["gpus"]["count"] == 0


# --- the whole orchestration against a fake nsys ------------------------------------------
FAKE_NSYS = r'''#!{py}
import os, shutil, sys
args = sys.argv[1:]
if args[:1] == ["--version"]:
    print("NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0"); sys.exit(0)
assert args[0] == "profile", args
base = args[args.index("-o") + 1]
app = args[args.index("-o") + 2:]
print("fake nsys running:", " ".join(app), flush=True)
print("stepscope-engine: phase=build model=x", flush=True)
print("stepscope-engine: phase=warmup steps=3", flush=True)
print("stepscope-engine: phase=capture range='step phase=decode'", flush=True)
if os.environ.get("FAKE_CRASH"):
    print("Traceback (most recent call last):", flush=True)
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)
if os.environ.get("FAKE_UNTRACED"):
    print('stepscope-engine: result={{"range": "step phase=decode batch=1", "torch": "2.11.0", '
          '"layers": 2, "untraced": {{"steps": 20, "step_time_ns": {{"median": 13600000, '
          '"p10": 13500000, "p90": 13900000, "min": 13400000, "max": 14000000, "n": 20}}}}}}',
          flush=True)
else:
    print('stepscope-engine: result={{"range": "step phase=decode batch=1"}}', flush=True)
open(base + ".nsys-rep", "w").write("rep")
if not os.environ.get("FAKE_NO_SQLITE"):
    mode = app[app.index("--mode") + 1] if "--mode" in app else "eager"
    shutil.copy(os.environ.get("FAKE_SQLITE_" + mode.upper(), os.environ["FAKE_SQLITE"]), base + ".sqlite")
'''


@pytest.fixture
def fake_machine(tmp_path):
    sqlite = EXTERNAL / "pipit_saxpy_2022.sqlite"
    if not sqlite.exists():
        pytest.skip(f"{sqlite} not present")
    inst = tmp_path / "nsight-systems/2025.3.1"
    (inst / "bin").mkdir(parents=True)
    (inst / "host-linux-x64").mkdir()
    nsys = inst / "bin/nsys"
    nsys.write_text(FAKE_NSYS.format(py=sys.executable))
    imp = inst / "host-linux-x64/QdstrmImporter"
    imp.write_text("#!/bin/sh\nexit 0\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-x)'\n")
    for p in (nsys, imp, smi):
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "NSYS": str(nsys),
           "STEPSCOPE_CACHE": str(tmp_path / "cache"), "FAKE_SQLITE": str(sqlite)}
    return tmp_path, env


def test_trace_end_to_end_with_fake_nsys(fake_machine):
    tmp, env = fake_machine
    out = tmp / "out"
    cp = cli("trace", "--engine", "torch", "--model", "llama-3.2-1b", "--mode", "both",
             "--layers", "2", "--out", str(out), "--json", env=env)
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)
    caps = res["captures"]
    assert [c["mode"] for c in caps] == ["eager", "graph"]
    for c in caps:
        stem = f"llama-3.2-1b_decode_b1_{c['mode']}"
        assert c["sqlite"] == str(out / f"{stem}.sqlite")
        for suffix in (".sqlite", ".nsys-rep", ".engine.log"):
            assert (out / f"{stem}{suffix}").exists()
        assert c["engine"] == {"range": "step phase=decode batch=1"}
        assert c["analysis"]["steps"]  # the analyzer ran on the export
        cmd = c["command"]
        assert cmd[:2] == [env["NSYS"], "profile"]
        assert cmd[cmd.index("-o") + 1] == str(out / stem)
        assert cmd[-8:] == ["--mode", c["mode"], "--tp", "1", "--warmup", "3", "--layers", "2"]
    log = (out / "llama-3.2-1b_decode_b1_eager.engine.log").read_text()
    assert log.startswith("# " + env["NSYS"] + " profile")
    assert "fake nsys running:" in log


def test_trace_writes_the_untraced_sidecar(fake_machine):
    """The engine's untraced timing goes into <name>.stepscope.json beside each export, with
    the step's shape; an engine that measured none leaves no sidecar (and an old one goes)."""
    from stepscope.ingest.sidecar import read_sidecar

    tmp, env = fake_machine
    out = tmp / "out"
    cp = cli("trace", "--engine", "torch", "--model", "llama-3.2-1b", "--mode", "both",
             "--layers", "2", "--out", str(out), "--json", env={**env, "FAKE_UNTRACED": "1"})
    assert cp.returncode == 0, cp.stderr
    for c in json.loads(cp.stdout)["captures"]:
        doc, warn = read_sidecar(c["sqlite"])
        assert warn is None and c["sidecar"] == str(out / f"llama-3.2-1b_decode_b1_{c['mode']}.stepscope.json")
        assert doc["engine"] == "torch" and doc["untraced"]["step_time_ns"]["median"] == 13_600_000
        assert doc["shape"] == {"model": "llama-3.2-1b", "phase": "decode", "batch": 1,
                                "context": 2048, "mode": c["mode"], "tp": 1, "layers": 2}
        assert "untraced" not in doc["capture"] and doc["capture"]["range"].startswith("step")
    cp = cli("trace", "--engine", "torch", "--model", "llama-3.2-1b", "--layers", "2",
             "--out", str(out), "--json", env=env)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["captures"][0]["sidecar"] is None
    assert not (out / "llama-3.2-1b_decode_b1_eager.stepscope.json").exists()


def test_trace_torch_only_options_refused_for_vllm():
    line = one_error_line(cli("trace", "--engine", "vllm", "--steps", "3", "--no-nvtx"))
    assert "--steps, --no-nvtx: torch engine only" in line


def test_trace_mode_both_prints_the_comparison(fake_machine):
    """--mode both ends with `stepscope compare` of the eager capture against the graph one
    (the fake nsys hands out the committed H200 eager and graph exports)."""
    tmp, env = fake_machine
    eager, graph = FIXTURES / "llama8b_decode_b1_eager.sqlite", FIXTURES / "llama8b_decode_b1_graph.sqlite"
    if not (eager.exists() and graph.exists()):
        pytest.skip("H200 fixtures not present")
    env = {**env, "FAKE_SQLITE_EAGER": str(eager), "FAKE_SQLITE_GRAPH": str(graph)}
    out = tmp / "out"
    cp = cli("trace", "--engine", "torch", "--model", "llama-3.2-1b", "--mode", "both",
             "--out", str(out), "--json", env=env)
    assert cp.returncode == 0, cp.stderr
    cmp = json.loads(cp.stdout)["compare"]
    assert cmp["a"]["n_launch_calls"] == 420 and cmp["b"]["n_launch_calls"] == 1
    # that machine's graph launch lead is 8× the bundled median (docs/WHATIF.md): the measured
    # step lies in the range, and B's own constants predict it within 2 %
    assert cmp["speedup"] > 3 and cmp["prediction_in_range"]
    assert abs(cmp["with_b_constants"]["prediction_error"]) < 0.02
    cp = cli("trace", "--engine", "torch", "--model", "llama-3.2-1b", "--mode", "both",
             "--out", str(tmp / "out2"), env=env)
    assert cp.returncode == 0, cp.stderr
    assert "== eager vs graph ==" in cp.stdout and "speedup (A/B)" in cp.stdout


def test_trace_engine_crash_is_one_line_with_the_log(fake_machine):
    tmp, env = fake_machine
    out = tmp / "out"
    line = one_error_line(cli("trace", "--engine", "torch", "--model", "llama-3.2-1b",
                              "--out", str(out), env={**env, "FAKE_CRASH": "1"}))
    assert "the eager capture failed (exit 1)" in line
    assert "CUDA out of memory" in line
    assert str(out / "llama-3.2-1b_decode_b1_eager.engine.log") in line


def test_trace_without_sqlite(fake_machine):
    tmp, env = fake_machine
    line = one_error_line(cli("trace", "--engine", "torch", "--model", "llama-3.2-1b",
                              "--out", str(tmp / "o"), env={**env, "FAKE_NO_SQLITE": "1"}))
    assert "nsys wrote no llama-3.2-1b_decode_b1_eager.sqlite" in line and "engine log" in line


def test_doctor_vllm_check(monkeypatch):
    """doctor names vLLM's version, the torch it pins against the one installed, the packages
    it requires that are missing, and what the engine does about flashinfer."""
    import importlib.metadata as md
    import importlib.util

    from stepscope.capture import doctor

    assert doctor.parse_requirement("torch==2.11.0") == ("torch", "==2.11.0", True)
    assert doctor.parse_requirement("fastapi[standard]>=0.115.0") == ("fastapi", ">=0.115.0", True)
    assert doctor.parse_requirement("pytest; extra == 'test'")[2] is False
    versions = {"vllm": "0.26.0", "torch": "2.13.0+cpu", "pydantic": "2.14.4"}
    reqs = ["torch==2.11.0", "pydantic>=2.12", "msgspec", "pytest; extra == 'test'"]

    def version(name):
        if name not in versions:
            raise md.PackageNotFoundError(name)
        return versions[name]

    real = importlib.util.find_spec
    monkeypatch.setattr(md, "version", version)
    monkeypatch.setattr(md, "requires", lambda name: reqs if name == "vllm" else [])
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: object() if n == "vllm" else (None if n in ("flashinfer", "nvtx") else real(n, *a)))
    v = doctor.check_vllm()
    assert v["version"] == "0.26.0" and v["torch_required"] == "==2.11.0"
    assert v["missing"] == ["msgspec"]
    assert v["mismatched"] == ["torch 2.13.0+cpu (vLLM 0.26.0 needs torch==2.11.0)"]
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in v["notes"][0] and "nvtx" in v["notes"][1]
    assert "missing packages vLLM requires: msgspec" in v["problem"]
