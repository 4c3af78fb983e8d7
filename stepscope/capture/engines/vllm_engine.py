"""The vLLM engine: vLLM's offline `LLM` on dummy weights, one step inside the capture range.

Written against vLLM's documented offline API; this module imports without vLLM (only `run()`
needs it), so the command and configuration building is testable anywhere.

- Model: a temporary directory holding the card's `config.json` (with `--layers` applied),
  loaded with `load_format="dummy"` and `skip_tokenizer_init=True`; prompts are token ids.
- Modes: `enforce_eager=True` for eager, vLLM's CUDA graphs otherwise.
- Which step is captured: vLLM's CUDA profiler hooks call cudaProfilerStart/Stop in the
  workers. vLLM >= 0.13 takes `profiler_config=ProfilerConfig(profiler="cuda",
  delay_iterations=D, max_iterations=1)` and `llm.start_profile()/stop_profile()`; older
  releases read `VLLM_TORCH_CUDA_PROFILE=1` (and `VLLM_PROFILER_DELAY_ITERS` /
  `VLLM_PROFILER_MAX_ITERS`) from the environment. After `start_profile()`, step 0 is the
  prefill and steps 1.. are decodes: prefill captures step 0; decode captures step D =
  `DECODE_DELAY`, with prompts of `context - D + 1` tokens, so that the captured decode step
  finds exactly `context` tokens in the cache.
- Steps are delimited by vLLM's own NVTX ranges (`VLLM_NVTX_SCOPES_FOR_PROFILING=1`) and by the
  capture range; workers are spawned (`VLLM_WORKER_MULTIPROC_METHOD=spawn`) and nsys follows
  them with `--trace-fork-before-exec=true`.
- Untraced timing: before the capture, the same step shape runs again with a timer inside the
  worker (`vllm_timer.StepTimer`, vLLM's `worker_extension_cls` hook) and with the frontend's
  wall clock around whole generate() calls; the figures go into the result (and from there
  into the `.stepscope.json` sidecar `stepscope trace` writes).
- Configuration that does not depend on the step's shape (max_num_seqs, the token budget,
  max_model_len, the CUDA-graph sizes) is the same for every batch of a model and context, so
  vLLM's torch.compile cache is shared by the graph captures of one model. Graphs are captured
  for a few sizes only (1, 2, 4, 8 and the batch), not vLLM's default 67: capture is then
  seconds, and a step of one of those sizes replays the same graph as with the default list.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stepscope.capture.engines.vllm_common import (ENV, _torch_version, base_kwargs, env,  # noqa: F401 (the engine's names)
                                                   with_options, write_model_dir)

ENGINE_TAG = "stepscope-engine:"
MODULE = "stepscope.capture.engines.vllm_engine"
DECODE_DELAY = 4  # decode steps after the prefill before the captured one
DECODE_UNTRACED = 48  # decode steps timed outside the capture range

def command(model: str, *, phase: str, batch: int, context: int, mode: str, tp: int,
            layers: int | None, python: str = sys.executable,
            model_arg: str | None = None, untraced_steps: int | None = None,
            inductor_names: str | None = None, sync_scheduling: bool = False,
            kv_cache_gib: float | None = None, serving: dict | None = None,
            quantization: str | None = None) -> list[str]:
    """`python -m stepscope.capture.engines.vllm_engine ...` (vLLM starts its own workers).
    `serving`: {requests, prompt_lens, output_lens, seed[, plain]} for a serving-like run."""
    cmd = [python, "-m", MODULE,
           "--model", model_arg or model,
           "--phase", phase,
           "--batch", str(batch),
           "--context", str(context),
           "--mode", mode,
           "--tp", str(tp)]
    if layers:
        cmd += ["--layers", str(layers)]
    if untraced_steps is not None:
        cmd += ["--untraced-steps", str(untraced_steps)]
    if inductor_names:
        cmd += ["--inductor-names", inductor_names]
    if sync_scheduling:
        cmd += ["--sync-scheduling"]
    if kv_cache_gib:
        cmd += ["--kv-cache-gib", f"{kv_cache_gib:g}"]
    if quantization:
        cmd += ["--quantization", quantization]
    if serving:
        cmd += ["--requests", str(serving["requests"]),
                "--prompt-lens", "{}:{}".format(*serving["prompt_lens"]),
                "--output-lens", "{}:{}".format(*serving["output_lens"]),
                "--seed", str(serving.get("seed", 0))]
        if serving.get("plain"):
            cmd += ["--plain"]
    return cmd


def prompt_len(phase: str, context: int) -> int:
    """Prompt length so that the captured step sees `context` (see module docstring)."""
    return context if phase == "prefill" else max(1, context - DECODE_DELAY + 1)


def profile_window(phase: str) -> tuple[int, int]:
    """(delay_iterations, max_iterations) after start_profile()."""
    return (0, 1) if phase == "prefill" else (DECODE_DELAY, 1)


def max_tokens(phase: str) -> int:
    return 1 if phase == "prefill" else DECODE_DELAY + 3


def graph_sizes(batch: int) -> list[int]:
    """CUDA-graph capture sizes: a few small ones and the batch (see module docstring)."""
    return sorted({1, 2, 4, 8, int(batch)})


def llm_kwargs(model_dir: str, *, phase: str, batch: int, context: int, mode: str, tp: int,
               profiler_config: Any | None = None, timer: bool = False,
               inductor_names: str | None = None, sync_scheduling: bool = False,
               kv_cache_gib: float | None = None, quantization: str | None = None) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM`."""
    plen = prompt_len(phase, context)
    # room for the prompt, the generated tokens and the untraced decode run, whatever the phase
    max_len = context + DECODE_UNTRACED + 64
    # the whole batch's prefill in one step, for any batch up to 8 (one configuration)
    kw = base_kwargs(model_dir, mode=mode, tp=tp, max_model_len=max_len, max_num_seqs=max(batch, 8),
                     max_num_batched_tokens=max(batch * plen, 8 * max_len, 8192))
    if mode != "eager":
        comp: dict[str, Any] = {"cudagraph_capture_sizes": graph_sizes(max(batch, 8))}
        if inductor_names:
            comp["inductor_compile_config"] = {"triton.descriptive_names": inductor_names}
        kw["compilation_config"] = comp
    return with_options(kw, sync_scheduling=sync_scheduling, kv_cache_gib=kv_cache_gib, timer=timer,
                        profiler_config=profiler_config, quantization=quantization)


def legacy_profiler_env(phase: str) -> dict[str, str]:
    """Environment for vLLM releases without `profiler_config`."""
    delay, max_iters = profile_window(phase)
    return {"VLLM_TORCH_CUDA_PROFILE": "1", "VLLM_PROFILER_DELAY_ITERS": str(delay),
            "VLLM_PROFILER_MAX_ITERS": str(max_iters)}


def token_prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[dict[str, list[int]]]:
    """Deterministic token-id prompts (no tokenizer)."""
    import random

    rng = random.Random(seed)
    hi = max(2, min(vocab, 32000)) - 1
    return [{"prompt_token_ids": [rng.randint(1, hi) for _ in range(length)]}
            for _ in range(batch)]


def say(msg: str) -> None:
    print(f"{ENGINE_TAG} {msg}", flush=True)


def _profiler_config(phase: str):
    """vLLM's ProfilerConfig when this vLLM has one with iteration control, else None."""
    delay, max_iters = profile_window(phase)
    try:
        from vllm.config import ProfilerConfig  # type: ignore
    except Exception:
        return None
    fields = getattr(ProfilerConfig, "__dataclass_fields__", {})
    if "delay_iterations" not in fields:
        return None
    return ProfilerConfig(profiler="cuda", delay_iterations=delay, max_iterations=max_iters)


def summarize_untraced(records: list[dict], phase: str, batch: int, plen: int,
                       per_token_wall_ns: float | None = None) -> dict:
    """The sidecar's `untraced` section from the worker timer's records.

    Steps of the captured shape only: decode steps (`batch` requests, one token each) or the
    prefill steps (`batch × plen` tokens). step_time_ns is the execute_model call's CUDA-event
    span (what the traced step, vLLM's `execute_context` range, covers); period_ns the time
    from one execute_model to the next (the engine's step rate: TPOT in decode)."""
    from stepscope.ingest.sidecar import stats

    want = batch if phase == "decode" else batch * plen
    execs = [r for r in records if r.get("call") == "execute_model"]
    mine = [r for r in execs if r.get("tokens") == want]
    if phase == "decode":
        mine = mine[2:]  # the first decode steps after a prefill are not yet steady
    period = [b["t0_ns"] - a["t0_ns"] for a, b in zip(execs, execs[1:])
              if a.get("tokens") == want and b.get("tokens") == want]
    sample_after = {id(a): b for a, b in zip(records, records[1:])
                    if a.get("call") == "execute_model" and b.get("call") == "sample_tokens"}
    samples = [sample_after[id(r)] for r in mine if id(r) in sample_after]
    out = {
        "method": "timer in vLLM's worker (worker_extension_cls): CUDA events at entry and exit "
                  "of execute_model (step_time_ns) and sample_tokens, host clock around each "
                  "call; outside nsys's capture range, same step shape",
        "steps": len(mine),
        "step_time_ns": stats(r["gpu_ns"] for r in mine),
        "host_ns": stats(r["t1_ns"] - r["t0_ns"] for r in mine),
        "engine_step_gpu_ns": stats(r["step_gpu_ns"] for r in mine if "step_gpu_ns" in r),
        "sample_gpu_ns": stats(r["gpu_ns"] for r in samples),
        "sample_host_ns": stats(r["t1_ns"] - r["t0_ns"] for r in samples),
        "period_ns": stats(period[2:] if phase == "decode" else period),
    }
    if per_token_wall_ns is not None:
        out["per_token_wall_ns"] = int(round(per_token_wall_ns))
    return out


def measure_untraced(llm, SamplingParams, *, phase: str, batch: int, plen: int, vocab: int,
                     steps: int) -> dict | None:
    """Time the step shape outside the capture range (see summarize_untraced)."""
    if steps <= 0:
        return None
    llm.collective_rpc("stepscope_timer_start")
    per_token = None
    try:
        if phase == "decode":
            n = max(4, steps)
            prompts = token_prompts(batch, plen, vocab, seed=3)

            def gen(k):
                p = SamplingParams(max_tokens=k, ignore_eos=True, temperature=0.0,
                                   detokenize=False)
                t = time.perf_counter_ns()
                llm.generate(prompts, p, use_tqdm=False)
                return time.perf_counter_ns() - t

            long_ns = gen(n + 2)
            short_ns = gen(2)
            # the frontend's view: n more decode steps cost this much wall time each
            per_token = (long_ns - short_ns) / n
        else:
            p = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0, detokenize=False)
            for i in range(max(3, min(steps, 8))):
                llm.generate(token_prompts(batch, plen, vocab, seed=10 + i), p, use_tqdm=False)
    finally:
        records = llm.collective_rpc("stepscope_timer_stop")[0]
    return summarize_untraced(records, phase, batch, plen, per_token)


def run(model: str, *, phase: str, batch: int, context: int, mode: str, tp: int,
        layers: int | None, untraced_steps: int = DECODE_UNTRACED,
        inductor_names: str | None = None, sync_scheduling: bool = False,
        kv_cache_gib: float | None = None, quantization: str | None = None) -> dict:
    from stepscope.capture.models import load_card

    card = load_card(model)
    for k, v in env().items():
        os.environ.setdefault(k, v)
    pconf = _profiler_config(phase)
    if pconf is None:
        os.environ.update(legacy_profiler_env(phase))
    say(f"phase=start model={card.name} engine=vllm")
    import vllm  # noqa: F401  (imported after the environment is set)
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stepscope-vllm-") as tmp:
        model_dir = write_model_dir(card.to_config(layers), tmp)
        say(f"phase=build model_dir={model_dir}")
        timer = untraced_steps > 0
        llm = LLM(**llm_kwargs(str(model_dir), phase=phase, batch=batch, context=context,
                               mode=mode, tp=tp, profiler_config=pconf, timer=timer,
                               inductor_names=inductor_names, sync_scheduling=sync_scheduling,
                               kv_cache_gib=kv_cache_gib, quantization=quantization))
        init_s = time.perf_counter() - t0
        plen = prompt_len(phase, context)
        prompts = token_prompts(batch, plen, card.vocab_size)
        params = SamplingParams(max_tokens=max_tokens(phase), ignore_eos=True, temperature=0.0,
                                detokenize=False)
        say("phase=warmup")
        llm.generate(prompts, params, use_tqdm=False)
        llm.generate(token_prompts(batch, plen, card.vocab_size, seed=1), params,
                     use_tqdm=False)
        untraced = None
        if timer:
            say(f"phase=untraced steps={untraced_steps}")
            try:
                untraced = measure_untraced(llm, SamplingParams, phase=phase, batch=batch,
                                            plen=plen, vocab=card.vocab_size,
                                            steps=untraced_steps)
            except Exception as e:  # the capture matters more than its untraced twin
                say(f"warning=untraced timing failed: {type(e).__name__}: {e}")
        say("phase=capture range='vLLM step (profiler hooks)'")
        t_cap = time.perf_counter()
        llm.start_profile()
        outs = llm.generate(token_prompts(batch, plen, card.vocab_size, seed=2), params,
                            use_tqdm=False)
        llm.stop_profile()
        result = {
            "engine": "vllm",
            "vllm": vllm.__version__,
            "torch": _torch_version(),
            "model": card.name,
            "phase": phase, "batch": batch, "context": context, "mode": mode, "tp": tp,
            "layers": layers or card.num_hidden_layers,
            "prompt_len": plen,
            "profiler": "profiler_config" if pconf is not None else "VLLM_TORCH_CUDA_PROFILE",
            "graph_sizes": graph_sizes(max(batch, 8)) if mode != "eager" else None,
            "inductor_names": inductor_names, "sync_scheduling": sync_scheduling,
            "kv_cache_gib": kv_cache_gib, "quantization": quantization,
            "model_runner": "v1" if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "0" else None,
            "next_tokens": [list(o.outputs[0].token_ids)[:4] for o in outs][:8],
            "init_s": round(init_s, 3),
            "capture_generate_s": round(time.perf_counter() - t_cap, 3),
            "total_wall_s": round(time.perf_counter() - t0, 3),
            "untraced": untraced,
        }
        say("result=" + json.dumps(result))
        del llm
    return result


def _serve(a) -> dict:
    """The serving-like run of `--requests` (vllm_serving.py)."""
    from stepscope.capture.engines import vllm_serving as vs

    work = vs.Workload(
        a.requests,
        vs.parse_range(a.prompt_lens, "--prompt-lens") if a.prompt_lens else vs.DEFAULT_PROMPT_LENS,
        vs.parse_range(a.output_lens, "--output-lens") if a.output_lens else vs.DEFAULT_OUTPUT_LENS,
        a.seed)
    result = vs.run(a.model, work, mode=a.mode, tp=a.tp, layers=a.layers, plain=a.plain,
                    kv_cache_gib=a.kv_cache_gib, sync_scheduling=a.sync_scheduling,
                    quantization=a.quantization, say=say)
    say("result=" + json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    from stepscope.capture.engines.args import add_step_args

    p = add_step_args(argparse.ArgumentParser(prog=f"python -m {MODULE}"))
    p.add_argument("--inductor-names", default=None,
                   choices=["original_aten", "torch", "inductor_node"],
                   help="graph mode: Inductor's triton.descriptive_names (kernel names that say "
                        "which ops a fused Triton kernel holds); default: vLLM's own setting")
    p.add_argument("--sync-scheduling", action="store_true",
                   help="turn vLLM's async scheduling off (one step at a time; for ncu)")
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV cache of this many GiB instead of 85%% of the GPU (for ncu)")
    p.add_argument("--quantization", default=None,
                   help="vLLM's quantization method (fp8: dynamic FP8 of the dummy weights)")
    p.add_argument("--requests", type=int, default=None,
                   help="a serving-like run of this many requests instead of one step")
    p.add_argument("--prompt-lens", default=None, help="serving run: prompt tokens A:B")
    p.add_argument("--output-lens", default=None, help="serving run: output tokens A:B")
    p.add_argument("--seed", type=int, default=0, help="serving run: the workload's seed")
    p.add_argument("--plain", action="store_true",
                   help="serving run without profiler hooks or timer (plain nsys profile)")
    p.set_defaults(untraced_steps=DECODE_UNTRACED)
    a = p.parse_args(argv)
    if a.mode == "compiled":
        p.error("--mode compiled is the torch engine's; vLLM's graph mode compiles already")
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print(f"{ENGINE_TAG} error=vLLM is not installed (pip install vllm)", file=sys.stderr,
              flush=True)
        return 2
    try:
        if a.requests:
            _serve(a)
        else:
            run(a.model, phase=a.phase, batch=a.batch, context=a.context, mode=a.mode,
                tp=a.tp, layers=a.layers, untraced_steps=a.untraced_steps,
                inductor_names=a.inductor_names, sync_scheduling=a.sync_scheduling,
                kv_cache_gib=a.kv_cache_gib, quantization=a.quantization)
    except Exception as e:
        # one line the orchestrator can quote (out of memory, unsupported card, ...); the
        # traceback above it stays in the engine log
        import traceback

        traceback.print_exc()
        msg = " ".join(f"{type(e).__name__}: {e}".split())[:400]
        print(f"{ENGINE_TAG} error=vLLM failed: {msg}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)  # vLLM's engine-core process and atexit hooks can hang a failed exit
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
