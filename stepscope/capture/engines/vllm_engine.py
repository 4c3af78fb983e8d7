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

ENGINE_TAG = "stepscope-engine:"
MODULE = "stepscope.capture.engines.vllm_engine"
DECODE_DELAY = 4  # decode steps after the prefill before the captured one

# Environment of the vLLM process (set by the orchestrator, and here for direct runs).
ENV = {
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_NVTX_SCOPES_FOR_PROFILING": "1",
    "VLLM_LOGGING_LEVEL": "INFO",
}


def command(model: str, *, phase: str, batch: int, context: int, mode: str, tp: int,
            layers: int | None, python: str = sys.executable,
            model_arg: str | None = None) -> list[str]:
    """`python -m stepscope.capture.engines.vllm_engine ...` (vLLM starts its own workers)."""
    cmd = [python, "-m", MODULE,
           "--model", model_arg or model,
           "--phase", phase,
           "--batch", str(batch),
           "--context", str(context),
           "--mode", mode,
           "--tp", str(tp)]
    if layers:
        cmd += ["--layers", str(layers)]
    return cmd


def prompt_len(phase: str, context: int) -> int:
    """Prompt length so that the captured step sees `context` (see module docstring)."""
    return context if phase == "prefill" else max(1, context - DECODE_DELAY + 1)


def profile_window(phase: str) -> tuple[int, int]:
    """(delay_iterations, max_iterations) after start_profile()."""
    return (0, 1) if phase == "prefill" else (DECODE_DELAY, 1)


def max_tokens(phase: str) -> int:
    return 1 if phase == "prefill" else DECODE_DELAY + 3


def llm_kwargs(model_dir: str, *, phase: str, batch: int, context: int, mode: str, tp: int,
               profiler_config: Any | None = None) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM`."""
    plen = prompt_len(phase, context)
    max_len = plen + max_tokens(phase) + 16
    kw: dict[str, Any] = {
        "model": model_dir,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "enforce_eager": mode == "eager",
        "tensor_parallel_size": tp,
        "max_model_len": max_len,
        "max_num_seqs": max(batch, 1),
        # the whole batch's prefill in one step
        "max_num_batched_tokens": max(batch * plen, max_len, 2048),
        "enable_prefix_caching": False,
        "gpu_memory_utilization": 0.85,
        "seed": 0,
    }
    if profiler_config is not None:
        kw["profiler_config"] = profiler_config
    return kw


def legacy_profiler_env(phase: str) -> dict[str, str]:
    """Environment for vLLM releases without `profiler_config`."""
    delay, max_iters = profile_window(phase)
    return {"VLLM_TORCH_CUDA_PROFILE": "1", "VLLM_PROFILER_DELAY_ITERS": str(delay),
            "VLLM_PROFILER_MAX_ITERS": str(max_iters)}


def write_model_dir(config: dict[str, Any], directory: str | os.PathLike) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config, indent=2))
    return d


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


def run(model: str, *, phase: str, batch: int, context: int, mode: str, tp: int,
        layers: int | None) -> dict:
    from stepscope.capture.models import load_card

    card = load_card(model)
    for k, v in ENV.items():
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
        llm = LLM(**llm_kwargs(str(model_dir), phase=phase, batch=batch, context=context,
                               mode=mode, tp=tp, profiler_config=pconf))
        plen = prompt_len(phase, context)
        prompts = token_prompts(batch, plen, card.vocab_size)
        params = SamplingParams(max_tokens=max_tokens(phase), ignore_eos=True, temperature=0.0,
                                detokenize=False)
        say("phase=warmup")
        llm.generate(prompts, params, use_tqdm=False)
        llm.generate(token_prompts(batch, plen, card.vocab_size, seed=1), params,
                     use_tqdm=False)
        say("phase=capture range='vLLM step (profiler hooks)'")
        llm.start_profile()
        outs = llm.generate(token_prompts(batch, plen, card.vocab_size, seed=2), params,
                            use_tqdm=False)
        llm.stop_profile()
        result = {
            "engine": "vllm",
            "vllm": vllm.__version__,
            "model": card.name,
            "phase": phase, "batch": batch, "context": context, "mode": mode, "tp": tp,
            "layers": layers or card.num_hidden_layers,
            "prompt_len": plen,
            "profiler": "profiler_config" if pconf is not None else "VLLM_TORCH_CUDA_PROFILE",
            "next_tokens": [list(o.outputs[0].token_ids)[:4] for o in outs][:8],
            "total_wall_s": round(time.perf_counter() - t0, 3),
        }
        say("result=" + json.dumps(result))
        del llm
    return result


def main(argv: list[str] | None = None) -> int:
    from stepscope.capture.engines.args import add_step_args

    p = add_step_args(argparse.ArgumentParser(prog=f"python -m {MODULE}"))
    a = p.parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print(f"{ENGINE_TAG} error=vLLM is not installed (pip install vllm)", file=sys.stderr,
              flush=True)
        return 2
    run(a.model, phase=a.phase, batch=a.batch, context=a.context, mode=a.mode, tp=a.tp,
        layers=a.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
