"""Sentinel microbenchmarks: the engine's own ops, one call each, for ncu to measure.

    python -m stepscope.bytes.sentinel --op gemm --proj qkv --m 2048 --model llama-3.1-8b
    python -m stepscope.bytes.sentinel --cells cells.json --model llama-3.1-8b --marker \
        --manifest manifest.jsonl

Every op comes from `stepscope.capture.engines.ops` (the torch engine's ops: Triton kernels
named like vLLM's for the light ops, cuBLASLt through `F.linear`, SDPA attention), so the
kernels ncu measures here are the kernels the engine launches. Per cell: build the inputs,
run the op `--warmups` times (default 10), synchronize, then exactly one call inside
`torch.cuda.profiler.start()/stop()` (cudaProfilerStart/Stop), which is all ncu profiles
under `--profile-from-start off`.

Several cells per process (`--cells FILE`, a JSON list of cell specs): each cell gets its own
start/stop range. With `--marker` a tiny `torch.cuda._sleep` launch (kernel `spin_kernel`)
opens each range, so the sweep runner can cut ncu's launch list back into cells by order:
every launch after the n-th marker and before the next belongs to the n-th cell whose
manifest line says `marker: true`. The manifest (JSON lines) records per cell: ok/error,
GPU name, and whether a range was opened. Nothing is printed to stdout (ncu's CSV goes there).

A cell spec: {"cell": "gemm_qkv_m2048", "op": "gemm", "proj": "qkv", "m": 2048,
"batch": null, "context": null}. Ops: gemm (proj qkv|o|gate_up|down|lm_head), norm, add_norm,
rope, kv_write, silu_mul, embedding, argmax, attn_prefill (m = prompt tokens, batch 1),
attn_decode (batch sequences × context cached tokens, one query each).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any, Callable

OPS = ("gemm", "norm", "add_norm", "rope", "kv_write", "silu_mul", "embedding", "argmax",
       "attn_prefill", "attn_decode")
PROJS = ("qkv", "o", "gate_up", "down", "lm_head")
MARKER_KERNEL = "spin_kernel"


def cell_id(spec: dict) -> str:
    op = spec["op"]
    if op == "gemm":
        return f"gemm_{spec['proj']}_m{spec['m']}"
    if op == "attn_decode":
        return f"attn_decode_b{spec.get('batch') or spec['m']}_ctx{spec.get('context')}"
    return f"{op}_m{spec['m']}"


def _ops():
    from stepscope.capture.engines import ops  # the engine's ops, not copies

    return ops


class Builder:
    """Builds each cell's inputs once per shape and returns a zero-argument call of the op."""

    def __init__(self, card: dict, device: str = "cuda", dtype: Any = None, seed: int = 0):
        import torch

        from stepscope.bytes.minbytes import shape_of

        self.torch = torch
        self.s = shape_of(card)
        self.card = card
        self.device = device
        self.dtype = dtype or torch.bfloat16
        self.eps = float(card.get("rms_norm_eps", 1e-5)) if isinstance(card, dict) else 1e-5
        self.theta = float(card.get("rope_theta", 10000.0)) if isinstance(card, dict) else 1e4
        self._cache: dict[tuple, Any] = {}
        self.gen = torch.Generator(device="cpu").manual_seed(seed)

    def t(self, key: tuple, shape: tuple, dtype=None, scale: float = 0.02):
        """A cached random tensor (made on device, so no host copy of multi-GB weights)."""
        k = (key, shape, dtype)
        if k not in self._cache:
            torch = self.torch
            self._cache[k] = (torch.randn(shape, device=self.device, dtype=torch.float32)
                              .mul_(scale).to(dtype or self.dtype))
        return self._cache[k]

    def build(self, spec: dict) -> Callable[[], Any]:
        torch, s, ops = self.torch, self.s, _ops()
        op, m = spec["op"], int(spec.get("m") or 1)
        h, dev = s.hidden, self.device
        if op == "gemm":
            proj = spec["proj"]
            k, n = s.proj(proj)
            w = self.t(("w", proj), (n, k))  # [out, in], as F.linear wants
            x = self.t(("x", k), (m, k), scale=1.0)
            return lambda: ops.linear(x, w)
        if op == "norm":
            x, w = self.t(("act", h), (m, h), scale=1.0), self.t(("nw",), (h,), scale=1.0)
            return lambda: ops.rms_norm(x, w, self.eps)
        if op == "add_norm":
            x, w = self.t(("act", h), (m, h), scale=1.0), self.t(("nw",), (h,), scale=1.0)
            r = self.t(("res", h), (m, h), scale=1.0)
            return lambda: ops.fused_add_rms_norm(x, r, w, self.eps)
        if op in ("rope", "kv_write"):
            qkv = self.t(("qkv", s.qkv_dim), (m, s.qkv_dim), scale=1.0)
            q = qkv[:, : s.q_dim]
            kk = qkv[:, s.q_dim: s.q_dim + s.kv_dim]
            v = qkv[:, s.q_dim + s.kv_dim:]
            if op == "rope":
                max_pos = max(8192, m + 1)
                key = ("cos_sin", max_pos)
                if key not in self._cache:
                    self._cache[key] = ops.make_cos_sin_cache(
                        s.head_dim, max_pos, self.theta, self.dtype, dev)
                cs = self._cache[key]
                pos = torch.arange(m, device=dev, dtype=torch.int64)
                return lambda: ops.rotary_embedding(pos, q, kk, cs)
            slots = max(4096, m)
            kc = self.t(("kcache", slots), (slots, s.kv_heads, s.head_dim), scale=0.0)
            vc = self.t(("vcache", slots), (slots, s.kv_heads, s.head_dim), scale=0.0)
            g = torch.Generator(device="cpu").manual_seed(m)
            slot_map = torch.randperm(slots, generator=g)[:m].to(dev)
            return lambda: ops.reshape_and_cache(kk, v, kc, vc, slot_map)
        if op == "silu_mul":
            x = self.t(("gu", s.intermediate), (m, 2 * s.intermediate), scale=1.0)
            return lambda: ops.silu_and_mul(x)
        if op == "embedding":
            table = self.t(("embed",), (s.vocab, h))
            g = torch.Generator(device="cpu").manual_seed(m)
            ids = torch.randint(0, s.vocab, (m,), generator=g).to(dev)
            return lambda: ops.embedding(ids, table)
        if op == "argmax":
            logits = self.t(("logits", m), (m, s.vocab), dtype=torch.float32, scale=1.0)
            return lambda: ops.argmax(logits)
        if op == "attn_prefill":
            b = int(spec.get("batch") or 1)
            q = self.t(("pq", b * m), (b * m, s.q_dim), scale=1.0)
            kk = self.t(("pk", b * m), (b * m, s.kv_dim), scale=1.0)
            v = self.t(("pv", b * m), (b * m, s.kv_dim), scale=1.0)
            return lambda: ops.attention_prefill(q, kk, v, s.heads, s.kv_heads, s.head_dim, b, m)
        if op == "attn_decode":
            b = int(spec.get("batch") or m)
            ctx = int(spec.get("context") or 2048)
            q = self.t(("dq", b), (b, s.q_dim), scale=1.0)
            kc = self.t(("dk", b, ctx), (b * ctx, s.kv_heads, s.head_dim), scale=1.0)
            vc = self.t(("dv", b, ctx), (b * ctx, s.kv_heads, s.head_dim), scale=1.0)
            return lambda: ops.attention_decode(q, kc, vc, ctx, s.heads, s.kv_heads,
                                                s.head_dim, b)
        raise ValueError(f"unknown op {op!r} (expected one of {', '.join(OPS)})")


def run_cells(specs: list[dict], card: dict, *, device: str = "cuda", warmups: int = 10,
              profile: bool = True, marker: bool = False, manifest=None) -> list[dict]:
    """Run each cell: warm-ups, then one profiled call. Returns one record per cell."""
    import torch

    cuda = device.startswith("cuda")
    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    b = Builder(card, device=device)
    records = []
    for spec in specs:
        rec = {"cell": spec.get("cell") or cell_id(spec), "gpu": gpu, "ok": False,
               "marker": False, "error": None}
        t0 = time.perf_counter()
        try:
            fn = b.build(spec)
            for _ in range(warmups):
                fn()
            if cuda:
                torch.cuda.synchronize()
            if profile and cuda:
                torch.cuda.profiler.start()
                try:
                    if marker:
                        torch.cuda._sleep(1)
                        rec["marker"] = True
                    fn()
                    torch.cuda.synchronize()
                finally:
                    torch.cuda.profiler.stop()
            else:
                fn()
                if cuda:
                    torch.cuda.synchronize()
            rec["ok"] = True
        except Exception as e:  # one failing cell never stops the others
            rec["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            traceback.print_exc(file=sys.stderr)
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        records.append(rec)
        if manifest is not None:
            manifest.write(json.dumps(rec) + "\n")
            manifest.flush()
        print(f"[sentinel] {rec['cell']}: {'ok' if rec['ok'] else rec['error']} "
              f"({rec['seconds']} s)", file=sys.stderr)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stepscope.bytes.sentinel",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b", help="card name or config.json path")
    ap.add_argument("--op", choices=OPS)
    ap.add_argument("--proj", choices=PROJS)
    ap.add_argument("--m", type=int, default=1, help="tokens (M); decode attention: batch")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--ctx", "--context", dest="context", type=int)
    ap.add_argument("--cells", help="JSON file with a list of cell specs (several cells)")
    ap.add_argument("--warmups", type=int, default=10)
    ap.add_argument("--marker", action="store_true", help="open each range with spin_kernel")
    ap.add_argument("--manifest", help="write one JSON line per cell here")
    ap.add_argument("--no-profile", action="store_true", help="sanity run: no profiler range")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)

    from stepscope.bytes.minbytes import load_card

    try:
        card = load_card(a.model)
    except Exception as e:
        print(f"sentinel: {e}", file=sys.stderr)
        return 2
    if a.cells:
        with open(a.cells) as f:
            specs = json.load(f)
    elif a.op:
        if a.op == "gemm" and not a.proj:
            ap.error("--op gemm needs --proj")
        specs = [{"op": a.op, "proj": a.proj, "m": a.m, "batch": a.batch, "context": a.context}]
    else:
        ap.error("give --op (one cell) or --cells FILE")
    for sp in specs:
        sp.setdefault("cell", cell_id(sp))
    if a.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("sentinel: no CUDA device visible to torch", file=sys.stderr)
            return 3
    man = open(a.manifest, "w") if a.manifest else None
    try:
        recs = run_cells(specs, card, device=a.device, warmups=a.warmups,
                         profile=not a.no_profile, marker=a.marker, manifest=man)
    finally:
        if man:
            man.close()
    return 0 if all(r["ok"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
