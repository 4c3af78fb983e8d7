"""The exact engine and analyzer command lines built for each `stepscope trace` option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.capture import run
from stepscope.capture.engines import vllm_engine
from stepscope.capture.run import TraceRequest

PY = "/usr/bin/python3"
TORCH_MOD = "stepscope.capture.engines.torch_engine"


def req(**kw) -> TraceRequest:
    base = dict(model="llama-3.1-8b", engine="torch", out=Path("/o"))
    base.update(kw)
    return TraceRequest(**base)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_torch_engine_decode(mode):
    cmd = run.engine_command(req(), "torch", mode, python=PY)
    assert cmd == [PY, "-m", TORCH_MOD, "--model", "llama-3.1-8b", "--phase", "decode",
                   "--batch", "1", "--context", "2048", "--mode", mode, "--tp", "1",
                   "--warmup", "3"]


def test_torch_engine_prefill_layers_batch():
    cmd = run.engine_command(req(phase="prefill", batch=4, context=512, layers=2), "torch",
                             "eager", python=PY)
    assert cmd == [PY, "-m", TORCH_MOD, "--model", "llama-3.1-8b", "--phase", "prefill",
                   "--batch", "4", "--context", "512", "--mode", "eager", "--tp", "1",
                   "--warmup", "3", "--layers", "2"]


def test_torch_engine_tp_goes_through_torch_distributed_run():
    cmd = run.engine_command(req(tp=2), "torch", "graph", python=PY)
    assert cmd == [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   "-m", TORCH_MOD, "--model", "llama-3.1-8b", "--phase", "decode",
                   "--batch", "1", "--context", "2048", "--mode", "graph", "--tp", "2",
                   "--warmup", "3"]


def test_local_config_paths_become_absolute(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m/config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    cmd = run.engine_command(req(model="m/config.json"), "torch", "eager", python=PY)
    assert cmd[cmd.index("--model") + 1] == str(tmp_path / "m/config.json")


def test_vllm_engine_command():
    cmd = run.engine_command(req(tp=2, layers=4, batch=8), "vllm", "graph", python=PY)
    assert cmd == [PY, "-m", "stepscope.capture.engines.vllm_engine", "--model",
                   "llama-3.1-8b", "--phase", "decode", "--batch", "8", "--context", "2048",
                   "--mode", "graph", "--tp", "2", "--layers", "4"]


def test_full_nsys_command_for_a_capture():
    r = req(batch=8, mode="both")
    assert r.modes == ["eager", "graph"]
    base = r.out / run.base_name(r, "graph")
    from stepscope.capture.nsys import profile_command

    cmd = profile_command("/n/nsys", base, run.engine_command(r, "torch", "graph", python=PY))
    assert cmd[:2] == ["/n/nsys", "profile"]
    assert cmd[cmd.index("-o") + 1] == "/o/llama-3.1-8b_decode_b8_graph"
    assert cmd[cmd.index("-o") + 2:] == run.engine_command(r, "torch", "graph", python=PY)


def test_base_names():
    assert run.base_name(req(), "eager") == "llama-3.1-8b_decode_b1_eager"
    assert run.base_name(req(phase="prefill", tp=2), "graph") == \
        "llama-3.1-8b_prefill_b1_graph_tp2"
    assert run.slug("/a/b/my-model/config.json") == "my-model"
    assert run.slug("/a/shape.json") == "shape"


def test_capture_file_names():
    cap = run.Capture(mode="eager", base=Path("/o/x_decode_b1_eager"), command=[])
    assert cap.sqlite == Path("/o/x_decode_b1_eager.sqlite")
    assert cap.nsys_rep == Path("/o/x_decode_b1_eager.nsys-rep")
    assert cap.log == Path("/o/x_decode_b1_eager.engine.log")


def test_engine_env():
    env = run.engine_env("torch", {"PYTHONPATH": "/other"})
    assert env["PYTHONPATH"].split(":") == [str(run.PACKAGE_ROOT), "/other"]
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in env
    env = run.engine_env("vllm", {})
    assert env["PYTHONPATH"] == str(run.PACKAGE_ROOT)
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["VLLM_NVTX_SCOPES_FOR_PROFILING"] == "1"


def test_analyze_command():
    cmd = run.analyze_command(Path("/o/x.sqlite"), True, python=PY)
    assert cmd == [PY, "-c", run.CLI_SHIM, "analyze", "/o/x.sqlite", "--json"]
    assert run.analyze_command(Path("/o/x.sqlite"), False, python=PY)[-1] == "/o/x.sqlite"


def test_engine_log_phases():
    assert run._engine_phase("stepscope-engine: phase=warmup steps=3") == ("warmup", None)
    assert run._engine_phase("noise") == (None, None)
    ph, res = run._engine_phase('stepscope-engine: result={"range": "step x"}')
    assert ph == "export" and res == {"range": "step x"}


def test_last_error_line(tmp_path):
    log = tmp_path / "e.log"
    log.write_text("# cmd\nTraceback (most recent call last):\n  File x\n"
                   "torch.OutOfMemoryError: CUDA out of memory.\nnsys: done\n")
    assert run.last_error_line(log) == "torch.OutOfMemoryError: CUDA out of memory."
    log.write_text("stepscope-engine: error=no CUDA device visible to torch\n")
    assert run.last_error_line(log) == "no CUDA device visible to torch"


# --- vLLM configuration (vLLM itself is not installed) -----------------------------------
def test_vllm_llm_kwargs_eager_and_graph():
    kw = vllm_engine.llm_kwargs("/tmp/m", phase="decode", batch=8, context=2048, mode="eager",
                                tp=2)
    assert kw["model"] == "/tmp/m" and kw["load_format"] == "dummy"
    assert kw["skip_tokenizer_init"] is True and kw["enforce_eager"] is True
    assert kw["tensor_parallel_size"] == 2 and kw["max_num_seqs"] == 8
    plen = vllm_engine.prompt_len("decode", 2048)
    assert kw["max_num_batched_tokens"] >= 8 * plen  # the prefill is one step
    assert kw["max_model_len"] >= plen + vllm_engine.max_tokens("decode")
    assert "profiler_config" not in kw
    kw = vllm_engine.llm_kwargs("/tmp/m", phase="prefill", batch=1, context=2048, mode="graph",
                                tp=1, profiler_config={"profiler": "cuda"})
    assert kw["enforce_eager"] is False and kw["profiler_config"] == {"profiler": "cuda"}


def test_vllm_step_selection():
    # prefill: the first step after start_profile; decode: step D, at exactly `context` cached
    assert vllm_engine.profile_window("prefill") == (0, 1)
    d, n = vllm_engine.profile_window("decode")
    assert n == 1 and d == vllm_engine.DECODE_DELAY
    assert vllm_engine.prompt_len("prefill", 2048) == 2048
    assert vllm_engine.prompt_len("decode", 2048) + d - 1 == 2048
    assert vllm_engine.max_tokens("decode") > d
    assert vllm_engine.legacy_profiler_env("decode") == {
        "VLLM_TORCH_CUDA_PROFILE": "1", "VLLM_PROFILER_DELAY_ITERS": str(d),
        "VLLM_PROFILER_MAX_ITERS": "1"}


def test_vllm_model_dir_and_prompts(tmp_path):
    from stepscope.capture.models import load_card

    cfg = load_card("llama-3.1-8b").to_config(2)
    d = vllm_engine.write_model_dir(cfg, tmp_path / "m")
    written = json.loads((d / "config.json").read_text())
    assert written["num_hidden_layers"] == 2 and written["architectures"] == ["LlamaForCausalLM"]
    ps = vllm_engine.token_prompts(3, 17, 128256)
    assert len(ps) == 3 and all(len(p["prompt_token_ids"]) == 17 for p in ps)
    assert ps == vllm_engine.token_prompts(3, 17, 128256)  # deterministic


def test_vllm_engine_without_vllm_says_so(capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM installed")
    rc = vllm_engine.main(["--model", "llama-3.1-8b"])
    assert rc == 2
    assert "vLLM is not installed" in capsys.readouterr().err


def test_vllm_config_is_shared_across_batches():
    """One model and context give one vLLM configuration for every batch up to 8 and both
    phases (so vLLM's torch.compile cache is shared): only the prompts differ."""
    keys = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "compilation_config")
    kws = [vllm_engine.llm_kwargs("/m", phase=ph, batch=b, context=2048, mode="graph", tp=1)
           for ph, b in (("decode", 1), ("decode", 8), ("prefill", 1))]
    assert all({k: kw[k] for k in keys} == {k: kws[0][k] for k in keys} for kw in kws)
    assert kws[0]["compilation_config"] == {"cudagraph_capture_sizes": [1, 2, 4, 8]}
    assert vllm_engine.graph_sizes(12) == [1, 2, 4, 8, 12]
    eager = vllm_engine.llm_kwargs("/m", phase="decode", batch=1, context=2048, mode="eager",
                                   tp=1, timer=True, inductor_names="torch")
    assert "compilation_config" not in eager
    assert eager["worker_extension_cls"] == "stepscope.capture.engines.vllm_timer.StepTimer"
    named = vllm_engine.llm_kwargs("/m", phase="decode", batch=1, context=2048, mode="graph",
                                   tp=1, inductor_names="original_aten")
    assert named["compilation_config"]["inductor_compile_config"] == {
        "triton.descriptive_names": "original_aten"}


def test_vllm_env_turns_the_flashinfer_sampler_off_without_flashinfer(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flashinfer" else real(name, *a))
    e = vllm_engine.env()
    assert e["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and e["VLLM_NVTX_SCOPES_FOR_PROFILING"] == "1"
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "flashinfer" else real(name, *a))
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in vllm_engine.env()


def test_vllm_untraced_summary():
    """The worker timer's records -> the sidecar's untraced section: only steps of the
    captured shape count (the prefill and the first two decodes are left out)."""
    recs = []
    t = 0
    for i in range(10):  # a prefill (8 x 2045 tokens), then 9 decode steps of 8 tokens
        tokens = 8 * 2045 if i == 0 else 8
        recs.append({"call": "execute_model", "t0_ns": t, "t1_ns": t + 9_000_000,
                     "gpu_ns": 12_000_000 + i, "tokens": tokens, "reqs": 8,
                     "step_gpu_ns": 13_000_000 + i})
        recs.append({"call": "sample_tokens", "t0_ns": t + 9_500_000, "t1_ns": t + 10_000_000,
                     "gpu_ns": 400_000})
        t += 15_000_000 if i else 40_000_000
    u = vllm_engine.summarize_untraced(recs, "decode", 8, 2045, per_token_wall_ns=15_200_000.4)
    assert u["steps"] == 7  # decode steps 3..9
    assert u["step_time_ns"] == {"median": 12_000_006, "p10": 12_000_003, "p90": 12_000_009,
                                 "min": 12_000_003, "max": 12_000_009, "n": 7}
    assert u["host_ns"]["median"] == 9_000_000 and u["sample_host_ns"]["median"] == 500_000
    assert u["engine_step_gpu_ns"]["median"] == 13_000_006
    assert u["period_ns"]["median"] == 15_000_000 and u["per_token_wall_ns"] == 15_200_000
    p = vllm_engine.summarize_untraced(recs, "prefill", 8, 2045)
    assert p["steps"] == 1 and p["step_time_ns"]["median"] == 12_000_000


def test_vllm_failure_is_one_line(tmp_path):
    """The vLLM engine turns a failure into one `error=` line after the traceback (exit 2);
    the orchestrator quotes that line with the log's path."""
    log = tmp_path / "v.log"
    log.write_text("# cmd\nTraceback (most recent call last):\n  File x\ntorch.OutOfMemoryError: CUDA out of "
                   "memory.\nstepscope-engine: error=vLLM failed: OutOfMemoryError: CUDA out of memory. Tried "
                   "to allocate 2.00 GiB\n(EngineCore pid=9) INFO shutting down\n")
    assert run.last_error_line(log) == "vLLM failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    cap = run.Capture(mode="eager", base=tmp_path / "x", command=["nsys"], returncode=2)
    cap_log = cap.log
    cap_log.write_text(log.read_text())
    with pytest.raises(run.EnvironmentProblem) as e:
        run.check_capture(cap)
    msg = str(e.value)
    assert "the eager capture failed (exit 2): vLLM failed: OutOfMemoryError" in msg and str(cap_log) in msg
    assert "\n" not in msg


def test_vllm_step_under_ncu_runs_with_async_scheduling_off():
    from stepscope.bytes.stepcells import engine_command

    cmd = engine_command("vllm", "llama-3.1-8b", phase="decode", batch=1, context=2048, mode="eager",
                         layers=None)
    assert cmd[-1] == "--sync-scheduling" and cmd[cmd.index("--untraced-steps") + 1] == "0"
    kw = vllm_engine.llm_kwargs("/m", phase="decode", batch=1, context=2048, mode="eager", tp=1,
                                sync_scheduling=True)
    assert kw["async_scheduling"] is False
    assert "async_scheduling" not in vllm_engine.llm_kwargs("/m", phase="decode", batch=1, context=2048,
                                                            mode="eager", tp=1)


def test_vllm_step_under_ncu_can_take_a_small_kv_cache():
    from stepscope.bytes.stepcells import engine_command

    cmd = engine_command("vllm", "llama-3.1-8b", phase="decode", batch=1, context=2048, mode="eager",
                         layers=4, kv_cache_gib=2.5)
    assert cmd[cmd.index("--kv-cache-gib") + 1] == "2.5"
    kw = vllm_engine.llm_kwargs("/m", phase="decode", batch=1, context=2048, mode="eager", tp=1,
                                kv_cache_gib=2.5)
    assert kw["kv_cache_memory_bytes"] == 2_684_354_560
    assert "kv_cache_memory_bytes" not in vllm_engine.llm_kwargs("/m", phase="decode", batch=1,
                                                                 context=2048, mode="eager", tp=1)


def test_trace_takes_the_ncu_steps_vllm_settings():
    cmd = run.engine_command(req(engine="vllm", sync_scheduling=True, kv_cache_gib=4), "vllm",
                             "eager", python=PY)
    assert "--sync-scheduling" in cmd and cmd[cmd.index("--kv-cache-gib") + 1] == "4"
    with pytest.raises(run.InputError, match="vLLM engine only"):
        run.validate(req(engine="torch", sync_scheduling=True))


FAKE_NCU = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "NVIDIA (R) Nsight Compute Command Line Profiler"; echo "Version 2025.3.1.0"; exit 0; fi
echo "==PROF== Connected to process $$"
"{python}" -c '
import time
print("==PROF== Profiling \\"rms_norm_kernel\\" - 0: 0%....50%....100% - 1 pass", flush=True)
def hang_here():
    time.sleep(600)
hang_here()
'
"""


def test_a_step_that_stalls_under_ncu_is_stopped_with_its_stacks(tmp_path):
    """The vLLM run that hung on the H200 printed nothing for minutes; the stall watch stops such
    a run after stall_s quiet seconds and leaves every Python thread's stack in the log."""
    import sys
    import time

    from stepscope.bytes import stepcells

    ncu = tmp_path / "ncu"
    ncu.write_text(FAKE_NCU.replace("{python}", sys.executable))
    ncu.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(run.EnvironmentProblem) as e:
        stepcells.run_step_cells("torch", "llama-3.1-8b", phase="decode", batch=1, context=2048,
                                 mode="eager", layers=1, out=tmp_path / "o", ncu=str(ncu),
                                 timeout_s=120, stall_s=3)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert "stalled under ncu: 1 kernel(s) profiled, then no output for 3 s" in msg, msg
    assert "rms_norm_kernel" in msg and "\n" not in msg
    assert took < 30  # stopped by the stall watch, not by the 120 s watchdog
    log = (tmp_path / "o" / "ncu.log").read_text()
    assert "Fatal Python error: Aborted" in log and "in hang_here" in log
    # the stall report: the fake ncu (sh) and its python child, each with its CPU use
    report = [ln for ln in log.splitlines() if ln.startswith("#   pid ")]
    assert any(" sh " in ln or " ncu " in ln for ln in report), report
    assert any(" python" in ln and " cpu 0%" in ln for ln in report), report


@pytest.mark.parametrize("engine,replay,target", [("vllm", "application", "application-only"),
                                                  ("torch", "kernel", "all")])
def test_cells_run_picks_the_replay_each_engine_was_measured_with(engine, replay, target):
    """vLLM's step gave no result under kernel replay on the H200 and all 436 kernels under
    application replay (fixtures/round6/); the torch step's 388 kernels ran under kernel replay."""
    from tests.conftest import CliRunner

    from stepscope.cli import app

    r = CliRunner().invoke(app, ["cells", "run", "--engine", engine, "--print-commands"])
    assert r.exit_code == 0, r.output
    cmd = r.output.split()
    assert cmd[cmd.index("--replay-mode") + 1] == replay
    assert cmd[cmd.index("--target-processes") + 1] == target
    r = CliRunner().invoke(app, ["cells", "run", "--engine", engine, "--print-commands",
                                 "--replay-mode", "kernel", "--target-processes", "all"])
    cmd = r.output.split()
    assert cmd[cmd.index("--replay-mode") + 1] == "kernel" and cmd[cmd.index("--target-processes") + 1] == "all"
