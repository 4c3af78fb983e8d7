"""What both vLLM engines of `stepscope trace` share (vllm_engine.py: one step; vllm_serving.py:
a serving-like run): the process's environment, the `vllm.LLM` arguments every run has, the
dummy model's folder. A module of its own so that the serving run does not import the step
engine that dispatches to it (no import circle between them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Environment of the vLLM process (set by the orchestrator, and here for direct runs).
ENV = {
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_NVTX_SCOPES_FOR_PROFILING": "1",
    "VLLM_LOGGING_LEVEL": "INFO",
    # the model is a config.json with dummy weights: nothing to fetch, nothing to report
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def env() -> dict[str, str]:
    """ENV, plus `VLLM_USE_FLASHINFER_SAMPLER=0` when flashinfer is not importable: vLLM's
    top-k/top-p sampler imports it otherwise, and greedy sampling needs none of it."""
    import importlib.util

    out = dict(ENV)
    if importlib.util.find_spec("flashinfer") is None:
        out["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    return out


def base_kwargs(model_dir: str, *, mode: str, tp: int, max_model_len: int, max_num_seqs: int,
                max_num_batched_tokens: int, seed: int = 0) -> dict[str, Any]:
    """What every `vllm.LLM` stepscope starts has: dummy weights, no tokenizer, bf16, eager or
    CUDA graphs, no prefix caching, and the given limits (a single step's or a serving run's)."""
    return {
        "model": model_dir,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "enforce_eager": mode == "eager",
        "tensor_parallel_size": tp,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "enable_prefix_caching": False,
        # several engines on one GPU (a capture session running them side by side) each take a share
        "gpu_memory_utilization": float(os.environ.get("STEPSCOPE_VLLM_GPU_UTIL", "0.85")),
        "seed": seed,
    }


def with_options(kw: dict[str, Any], *, sync_scheduling: bool = False, kv_cache_gib: float | None = None,
                 timer: bool = False, profiler_config: Any | None = None,
                 quantization: str | None = None) -> dict[str, Any]:
    """`kw` with the capture's options: async scheduling off, a KV cache of a given size, the
    untraced timer's worker extension, vLLM's profiler config, a quantization method."""
    if quantization:
        # vLLM quantizes the dummy bf16 weights itself (fp8: per-tensor weight scales, dynamic
        # per-token activation scales), the kernels a served FP8 model runs
        kw["quantization"] = quantization
    if sync_scheduling:
        # one step at a time: under ncu, which serializes every kernel, vLLM 0.26's async
        # scheduling (the next step prepared while this one runs) is the first suspect of the
        # hang seen on the H200 (fixtures/ncu/step_vllm_hung/); not yet run on a GPU
        kw["async_scheduling"] = False
    if kv_cache_gib:
        # a KV cache of this size instead of 85 % of the GPU: the step's kernels are the same
        # (its blocks are few either way) and ncu keeps the rest of the memory for itself
        kw["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
    if timer:
        from stepscope.capture.engines.vllm_timer import QUALNAME

        kw["worker_extension_cls"] = QUALNAME
    if profiler_config is not None:
        kw["profiler_config"] = profiler_config
    return kw


def write_model_dir(config: dict[str, Any], directory: str | os.PathLike) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config, indent=2))
    return d


def _torch_version() -> str | None:
    try:
        import torch

        return torch.__version__
    except Exception:
        return None
