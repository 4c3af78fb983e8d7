"""The serving-like vLLM run of `stepscope trace --requests` (capture/engines/vllm_serving.py):
its command line, workload, engine settings and the sidecar it leaves, checked against the run
captured on the H200 (fixtures/serving/)."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from stepscope.capture.engines import vllm_engine, vllm_serving as vs
from stepscope.capture.run import TraceRequest, base_name, engine_command, sidecar_doc, validate
from stepscope.errors import InputError

SIDECAR = FIXTURES / "serving" / "llama-3.1-8b_serve_r48_s0_graph.stepscope.json"


def test_the_workload_is_the_same_for_a_seed_and_within_its_ranges():
    w = vs.Workload(48, (16, 3000), (4, 96), 0)
    a, b = w.lengths(), vs.Workload(48, (16, 3000), (4, 96), 0).lengths()
    assert a == b and len(a) == 48
    assert all(16 <= p <= 3000 and 4 <= o <= 96 for p, o in a)
    assert vs.Workload(48, (16, 3000), (4, 96), 1).lengths() != a
    prompts = w.prompts(128256)
    assert [len(p["prompt_token_ids"]) for p in prompts] == [p for p, _ in a]
    # room for the longest prompt and output, in whole KV blocks of 256 tokens
    assert w.max_model_len == 3328


def test_the_captured_run_had_this_workload():
    doc = json.loads(SIDECAR.read_text())
    want = vs.Workload(48, (16, 3000), (4, 96), 0).to_dict()
    assert doc["capture"]["workload"] == want
    # every prompt token and every output token but each request's first is scheduled once
    steps = doc["untraced"]["per_step"]
    assert sum(s["ctx_tokens"] for s in steps) + sum(s["gen_tokens"] for s in steps) == \
        want["prompt_tokens"] + want["output_tokens"] - 48
    assert all(s["tokens"] <= vs.TOKEN_BUDGET and s["reqs"] <= vs.MAX_NUM_SEQS for s in steps)


@pytest.mark.parametrize("text,want", [("16:3000", (16, 3000)), ("7", (7, 7)), ("1:1", (1, 1))])
def test_ranges(text, want):
    assert vs.parse_range(text, "--prompt-lens") == want


@pytest.mark.parametrize("text", ["0:5", "9:3", "a:b", "1:2:3", ""])
def test_bad_ranges_say_what_is_wrong(text):
    with pytest.raises(ValueError, match="--prompt-lens must be A:B"):
        vs.parse_range(text, "--prompt-lens")


def test_engine_command_and_file_names():
    req = TraceRequest(model="llama-3.1-8b", engine="vllm", mode="both", requests=48,
                       prompt_lens=(16, 3000), output_lens=(4, 96), seed=3)
    cmd = engine_command(req, "vllm", "graph", python="py")
    i = cmd.index("--requests")
    assert cmd[i:] == ["--requests", "48", "--prompt-lens", "16:3000", "--output-lens", "4:96",
                       "--seed", "3"]
    assert base_name(req, "graph") == "llama-3.1-8b_serve_r48_s3_graph"
    assert req.modes == ["eager", "graph"]


def test_serving_engine_settings_are_vllms_defaults_but_the_batch_limits():
    w = vs.Workload(48)
    kw = vs.llm_kwargs("/m", w, mode="graph", tp=1, timer=True, profiler_config=None)
    assert kw["max_num_seqs"] == 32 and kw["max_num_batched_tokens"] == 2048
    assert kw["enable_chunked_prefill"] is True and kw["enforce_eager"] is False
    assert "compilation_config" not in kw and "async_scheduling" not in kw
    assert kw["worker_extension_cls"].endswith("StepTimer")
    assert vs.llm_kwargs("/m", w, mode="eager", tp=1, timer=False,
                         profiler_config=None)["enforce_eager"] is True


def test_torch_engine_and_a_range_beyond_the_model_are_refused(monkeypatch):
    import stepscope.capture.run as run_mod

    monkeypatch.setattr(run_mod, "vllm_available", lambda: True)
    with pytest.raises(InputError, match="--requests runs vLLM"):
        validate(TraceRequest(model="llama-3.1-8b", engine="torch", requests=4))
    with pytest.raises(InputError, match="exceed"):
        validate(TraceRequest(model="llama-3.2-1b", engine="vllm", requests=4,
                              prompt_lens=(16, 200_000)))


def test_summarize_steps_pairs_each_forward_with_its_sampling():
    recs = [
        {"call": "execute_model", "t0_ns": 0, "t1_ns": 10, "tokens": 5, "reqs": 2,
         "ctx_reqs": 1, "ctx_tokens": 4, "gen_reqs": 1, "gen_tokens": 1, "gpu_ns": 100,
         "step_gpu_ns": 130},
        {"call": "sample_tokens", "t0_ns": 12, "t1_ns": 15, "gpu_ns": 20},
        {"call": "execute_model", "t0_ns": 40, "t1_ns": 45, "tokens": 2, "reqs": 2,
         "gpu_ns": 60},
    ]
    out = vs.summarize_steps(recs, wall_ns=999)
    first, second = out["per_step"]
    assert (first["step_time_ns"], first["host_ns"], first["period_ns"]) == (130, 13, 40)
    assert (second["step_time_ns"], second["host_ns"], second["period_ns"]) == (60, 5, None)
    assert out["steps"] == 2 and out["generate_wall_ns"] == 999 and out["kind"] == "serving"


def test_the_sidecar_of_a_serving_run_records_its_workload():
    req = TraceRequest(model="llama-3.1-8b", engine="vllm", requests=48)
    from stepscope.capture.models import load_card
    from stepscope.capture.run import Capture
    from pathlib import Path

    doc = json.loads(SIDECAR.read_text())
    cap = Capture(mode="graph", base=Path("x"), command=[],
                  engine_result={**doc["capture"], "untraced": doc["untraced"]})
    side = sidecar_doc(cap, req, "vllm", load_card("llama-3.1-8b"))
    assert side["shape"]["phase"] == "serving"
    assert side["shape"]["workload"]["requests"] == 48
    assert side["untraced"]["per_step"] == doc["untraced"]["per_step"]


def test_engine_cli_takes_the_serving_arguments(capsys):
    # without vLLM the engine says so in one line; the arguments themselves parse
    rc = vllm_engine.main(["--model", "llama-3.1-8b", "--requests", "4", "--prompt-lens",
                           "16:64", "--output-lens", "4:8", "--seed", "1", "--plain"])
    assert rc == 2 and "vLLM is not installed" in capsys.readouterr().err
