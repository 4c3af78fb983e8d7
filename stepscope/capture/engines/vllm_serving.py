"""A serving-like vLLM run: many requests of mixed lengths through the offline engine.

`stepscope trace --requests N` runs this instead of one step: N requests with prompt and output
lengths drawn (seeded) from ranges, submitted at once to vLLM's `LLM.generate`, so the engine
runs what a server runs — continuous batching, chunked prefill that puts prompt chunks and
decodes in one step, async scheduling, CUDA graphs for the batch sizes vLLM captured and none
for the others. vLLM's own configuration is left at its defaults except for the batch limits
(`max_num_seqs`, the token budget) and the dummy weights.

Order of work after the engine has started:
1. a short warm-up generate (JIT, allocator);
2. the untraced run: the same workload with the worker timer (vllm_timer.StepTimer) recording
   every `execute_model` / `sample_tokens` call — host clock and CUDA events, and the step's
   composition (prompt requests and tokens, decode requests and tokens, as vLLM's
   `compute_iteration_details` counts them) — outside nsys's capture range;
3. the traced run: the same workload again between `llm.start_profile()` and `stop_profile()`
   (vLLM's "cuda" profiler: cudaProfilerStart/Stop in the worker, no iteration limit), which is
   nsys's capture range.
The scheduler's decisions depend only on the requests, so step k of the traced run has the
composition of step k of the untraced one; the sidecar keeps every untraced step.

`--plain` is the capture most users make: no profiler hooks (so no `execute_context` ranges),
no timer, no warm-up; the orchestrator wraps it in an nsys without a capture range, start-up
included.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from stepscope.capture.engines.vllm_common import base_kwargs, with_options

DEFAULT_PROMPT_LENS = (16, 3000)
DEFAULT_OUTPUT_LENS = (4, 96)
MAX_NUM_SEQS = 32
TOKEN_BUDGET = 2048


def parse_range(text: str, name: str) -> tuple[int, int]:
    """`A:B` (or one number) -> (A, B) with 1 <= A <= B."""
    parts = str(text).split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        raise ValueError(f"{name} must be A:B (two whole numbers), got {text!r}") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"{name} must be A:B with 1 <= A <= B, got {text!r}")
    return lo, hi


@dataclass(frozen=True)
class Workload:
    requests: int
    prompt_lens: tuple[int, int] = DEFAULT_PROMPT_LENS
    output_lens: tuple[int, int] = DEFAULT_OUTPUT_LENS
    seed: int = 0

    def lengths(self) -> list[tuple[int, int]]:
        """(prompt tokens, output tokens) of every request, the same for a seed."""
        rng = random.Random(self.seed)
        return [(rng.randint(*self.prompt_lens), rng.randint(*self.output_lens))
                for _ in range(self.requests)]

    def prompts(self, vocab: int) -> list[dict[str, list[int]]]:
        rng = random.Random(self.seed + 1)
        hi = max(2, min(vocab, 32000)) - 1
        return [{"prompt_token_ids": [rng.randint(1, hi) for _ in range(p)]}
                for p, _ in self.lengths()]

    @property
    def max_model_len(self) -> int:
        return -(-(self.prompt_lens[1] + self.output_lens[1] + 16) // 256) * 256

    def to_dict(self) -> dict[str, Any]:
        ls = self.lengths()
        return {"requests": self.requests, "prompt_lens": list(self.prompt_lens),
                "output_lens": list(self.output_lens), "seed": self.seed,
                "prompt_tokens": sum(p for p, _ in ls), "output_tokens": sum(o for _, o in ls)}


def llm_kwargs(model_dir: str, work: Workload, *, mode: str, tp: int, timer: bool,
               profiler_config: Any | None, max_num_seqs: int = MAX_NUM_SEQS,
               token_budget: int = TOKEN_BUDGET, kv_cache_gib: float | None = None,
               sync_scheduling: bool = False, quantization: str | None = None) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for a serving run: vLLM's defaults (chunked prefill,
    async scheduling, its own CUDA-graph sizes) but for the batch limits and dummy weights."""
    kw = base_kwargs(model_dir, mode=mode, tp=tp, max_model_len=work.max_model_len, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=token_budget, seed=work.seed)
    kw["enable_chunked_prefill"] = True
    return with_options(kw, sync_scheduling=sync_scheduling, kv_cache_gib=kv_cache_gib, timer=timer,
                        profiler_config=profiler_config, quantization=quantization)


def sampling(SamplingParams, work: Workload) -> list:
    return [SamplingParams(max_tokens=o, ignore_eos=True, temperature=0.0, detokenize=False)
            for _, o in work.lengths()]


def summarize_steps(records: list[dict], wall_ns: int | None = None) -> dict:
    """The sidecar's `untraced` section of a serving run: one row per engine step (an
    execute_model call and the sample_tokens call after it), in order.

    step_time_ns of a step: the CUDA-event span from execute_model's entry to sample_tokens'
    exit (the engine step as the stream sees it); period_ns: the host time from this step's
    execute_model entry to the next one's (the step rate a user sees under async scheduling)."""
    from stepscope.ingest.sidecar import stats

    execs = [i for i, r in enumerate(records) if r.get("call") == "execute_model"]
    steps = []
    for k, i in enumerate(execs):
        r = records[i]
        nxt = records[i + 1] if i + 1 < len(records) else None
        sample = nxt if nxt is not None and nxt.get("call") == "sample_tokens" else None
        row = {
            "index": k,
            "tokens": r.get("tokens"),
            "reqs": r.get("reqs"),
            "ctx_reqs": r.get("ctx_reqs"), "ctx_tokens": r.get("ctx_tokens"),
            "gen_reqs": r.get("gen_reqs"), "gen_tokens": r.get("gen_tokens"),
            "forward_gpu_ns": r.get("gpu_ns"),
            "step_time_ns": r.get("step_gpu_ns", r.get("gpu_ns")),
            "host_ns": r["t1_ns"] - r["t0_ns"] + ((sample["t1_ns"] - sample["t0_ns"])
                                                    if sample else 0),
            "period_ns": (records[execs[k + 1]]["t0_ns"] - r["t0_ns"])
            if k + 1 < len(execs) else None,
        }
        steps.append(row)
    real = [s for s in steps if (s["tokens"] or 0) > 0]
    out = {
        "method": "timer in vLLM's worker (worker_extension_cls): CUDA events from "
                  "execute_model's entry to sample_tokens' exit, host clock around each call, "
                  "step composition from vllm.v1.utils.compute_iteration_details; the same "
                  "workload run outside nsys's capture range",
        "kind": "serving",
        "steps": len(real),
        "step_time_ns": stats(s["step_time_ns"] for s in real),
        "period_ns": stats(s["period_ns"] for s in real if s["period_ns"] is not None),
        "host_ns": stats(s["host_ns"] for s in real),
        "per_step": steps,
    }
    if wall_ns is not None:
        out["generate_wall_ns"] = int(wall_ns)
    return out


def run(model: str, work: Workload, *, mode: str, tp: int, layers: int | None,
        plain: bool = False, kv_cache_gib: float | None = None,
        sync_scheduling: bool = False, quantization: str | None = None, say=print) -> dict:
    from stepscope.capture.engines import vllm_common as ve
    from stepscope.capture.models import load_card

    card = load_card(model)
    for k, v in ve.env().items():
        if plain and k == "VLLM_NVTX_SCOPES_FOR_PROFILING":
            continue  # a plain capture keeps whatever the user's environment says
        os.environ.setdefault(k, v)
    say(f"phase=start model={card.name} engine=vllm requests={work.requests}")
    import vllm
    from vllm import LLM, SamplingParams

    pconf = None
    if not plain:
        from vllm.config import ProfilerConfig  # type: ignore

        pconf = ProfilerConfig(profiler="cuda")  # no delay, no iteration limit
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stepscope-vllm-") as tmp:
        model_dir = ve.write_model_dir(card.to_config(layers), tmp)
        say(f"phase=build model_dir={model_dir}")
        llm = LLM(**llm_kwargs(str(model_dir), work, mode=mode, tp=tp, timer=not plain,
                               profiler_config=pconf, kv_cache_gib=kv_cache_gib,
                               sync_scheduling=sync_scheduling, quantization=quantization))
        init_s = time.perf_counter() - t0
        prompts = work.prompts(card.vocab_size)
        params = sampling(SamplingParams, work)
        untraced = None
        traced_wall_ns = None
        if plain:
            say("phase=capture range='whole process (plain nsys)'")
            t = time.perf_counter_ns()
            llm.generate(prompts, params, use_tqdm=False)
            traced_wall_ns = time.perf_counter_ns() - t
        else:
            say("phase=warmup")
            warm = Workload(min(4, work.requests), (16, 64), (2, 4), work.seed + 7)
            llm.generate(warm.prompts(card.vocab_size), sampling(SamplingParams, warm),
                         use_tqdm=False)
            say(f"phase=untraced requests={work.requests}")
            try:
                llm.collective_rpc("stepscope_timer_start")
                t = time.perf_counter_ns()
                llm.generate(prompts, params, use_tqdm=False)
                wall = time.perf_counter_ns() - t
                records = llm.collective_rpc("stepscope_timer_stop")[0]
                untraced = summarize_steps(records, wall)
            except Exception as e:  # the capture matters more than its untraced twin
                say(f"warning=untraced timing failed: {type(e).__name__}: {e}")
            say("phase=capture range='the whole generate (vLLM profiler hooks)'")
            llm.start_profile()
            t = time.perf_counter_ns()
            llm.generate(prompts, params, use_tqdm=False)
            traced_wall_ns = time.perf_counter_ns() - t
            llm.stop_profile()
        result = {
            "engine": "vllm", "vllm": vllm.__version__, "torch": ve._torch_version(),
            "model": card.name, "phase": "serving", "mode": mode, "tp": tp,
            "layers": layers or card.num_hidden_layers,
            "workload": work.to_dict(),
            "max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": TOKEN_BUDGET,
            "plain": plain, "sync_scheduling": sync_scheduling, "kv_cache_gib": kv_cache_gib,
            "quantization": quantization,
            "profiler": None if plain else "profiler_config(profiler='cuda')",
            "init_s": round(init_s, 3),
            "traced_generate_wall_ns": traced_wall_ns,
            "total_wall_s": round(time.perf_counter() - t0, 3),
            "untraced": untraced,
        }
        del llm
    return result
