"""Untraced step timing inside vLLM's worker: `worker_extension_cls` methods.

vLLM mixes this class into its GPU worker when `LLM(worker_extension_cls=QUALNAME)` is given
(the documented hook for calling into workers by name with `llm.collective_rpc`), so the
timing runs where the steps run, in the engine-core process, without pickling code across.

`stepscope_timer_start()` wraps the worker's `execute_model` and `sample_tokens` (instance
attributes shadow the class's methods, and vLLM's executors call them by name); every call
records the host clock at entry and exit and a CUDA event on the current stream at entry and
exit. `stepscope_timer_stop()` removes the wrappers and returns one plain dict per call with
the events resolved to nanoseconds. Events are compared only on one stream, the one the model
runner launches its forward on.

Imported by vLLM inside the worker (torch is there); nothing here imports vLLM.
"""

from __future__ import annotations

import time

QUALNAME = "stepscope.capture.engines.vllm_timer.StepTimer"
_WRAPPED = ("execute_model", "sample_tokens")


def _composition(scheduler_output) -> dict:
    """Prompt (context) and decode (generation) requests and tokens of a step, counted as
    vLLM's own step range name counts them; {} where this vLLM has no such helper."""
    try:
        from vllm.v1.utils import compute_iteration_details

        d = compute_iteration_details(scheduler_output)
        return {"ctx_reqs": int(d.num_ctx_requests), "ctx_tokens": int(d.num_ctx_tokens),
                "gen_reqs": int(d.num_generation_requests),
                "gen_tokens": int(d.num_generation_tokens)}
    except Exception:
        return {}


class StepTimer:
    def stepscope_timer_start(self) -> bool:
        import torch

        records: list[dict] = []
        self._stepscope_records = records

        def wrap(name, fn):
            def timed(*args, **kwargs):
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter_ns()
                e0.record()
                out = fn(*args, **kwargs)
                e1.record()
                t1 = time.perf_counter_ns()
                rec = {"call": name, "t0_ns": t0, "t1_ns": t1, "_e0": e0, "_e1": e1}
                so = args[0] if args else None
                if name == "execute_model" and so is not None:
                    rec["tokens"] = int(getattr(so, "total_num_scheduled_tokens", 0) or 0)
                    rec["reqs"] = len(getattr(so, "num_scheduled_tokens", {}) or {})
                    rec.update(_composition(so))
                records.append(rec)
                return out
            return timed

        for name in _WRAPPED:
            setattr(self, name, wrap(name, getattr(type(self), name).__get__(self)))
        return True

    def stepscope_timer_stop(self) -> list[dict]:
        import torch

        for name in _WRAPPED:
            self.__dict__.pop(name, None)
        torch.cuda.synchronize()
        recs = getattr(self, "_stepscope_records", [])
        self._stepscope_records = []
        out = []
        for i, r in enumerate(recs):
            d = {k: v for k, v in r.items() if not k.startswith("_")}
            d["gpu_ns"] = int(r["_e0"].elapsed_time(r["_e1"]) * 1e6)
            # an execute_model and the sample_tokens right after it: the engine step's GPU
            # span from the forward's start to the end of sampling
            if r["call"] == "execute_model" and i + 1 < len(recs) \
                    and recs[i + 1]["call"] == "sample_tokens":
                d["step_gpu_ns"] = int(r["_e0"].elapsed_time(recs[i + 1]["_e1"]) * 1e6)
            out.append(d)
        return out
