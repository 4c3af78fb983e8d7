"""The built-in engine: one Llama-architecture step in plain PyTorch, random bf16 weights.

No vLLM needed. The step is the one vLLM runs for a Llama model, op by op (see `ops.py` for
the kernel names): embedding; per layer fused add+RMSNorm (plain RMSNorm on layer 0), QKV GEMM,
RoPE, KV-cache write, attention (SDPA with GQA), O GEMM, [all-reduce], fused add+RMSNorm,
gate_up GEMM, SiLU·mul, down GEMM, [all-reduce]; final norm, LM head, [all-gather], argmax.
The residual adds are fused into the norms, as in vLLM.

Tensor parallelism (one process per rank, launched by `torch.distributed.run`, NCCL):
attention heads (query and KV; KV heads are replicated when there are fewer than ranks), the
MLP intermediate dimension and the LM head's vocabulary are sharded; the O and down
projections are row-parallel and followed by an all-reduce; the LM head is column-parallel and
its logits are all-gathered before the argmax (as vLLM does). The embedding table is kept
whole on every rank (vLLM shards it and all-reduces; that would add one collective per step).

Run as `python -m stepscope.capture.engines.torch_engine --model llama-3.1-8b --phase decode
--batch 1 --context 2048 --mode eager` (the `stepscope trace` command does this under nsys).
It runs warm-up steps, then exactly one profiled step inside `cudaProfilerStart/Stop` and an
NVTX range named by `step_range_name()`; in graph mode the range wraps the graph replay.
Progress goes to stdout as `stepscope-engine: phase=<name>` lines and a final
`stepscope-engine: result=<json>` line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from stepscope.capture.engines import ops
from stepscope.capture.engines.args import add_step_args
from stepscope.capture.models import LLAMA_LIKE, Card, load_card

ENGINE_TAG = "stepscope-engine:"


@dataclass(frozen=True)
class StepSpec:
    model: str
    phase: str = "decode"  # decode | prefill
    batch: int = 1
    context: int = 2048  # decode: tokens already in the cache; prefill: prompt length
    mode: str = "eager"  # eager | graph
    tp: int = 1
    layers: int | None = None  # None: the card's layer count
    warmup: int = 3
    seed: int = 0
    shard_from_full: bool = False  # tests: every TP width computes the same step
    steps: int = 1  # steps inside the capture range (>1: token fed back, copied to the host)
    step_name: str | None = None  # NVTX name of each captured step (None: step_range_name())
    nvtx: bool = True  # False: no step range, only the capture range delimits
    ops: str = "auto"  # light ops: auto (Triton on CUDA), torch (plain ATen ops) or triton
    emit_nvtx: bool = False  # PyTorch's emit_nvtx: an aten:: range around every op
    untraced_steps: int = 20  # steps timed outside the capture range (the sidecar)

    @property
    def tokens(self) -> int:
        """New tokens in the step: one per sequence in decode, the whole prompts in prefill."""
        return self.batch if self.phase == "decode" else self.batch * self.context


def step_range_name(spec: StepSpec, model_name: str, layers: int) -> str:
    """The NVTX range around the profiled step (the analyzer reads these fields)."""
    model_name = "-".join(model_name.split()) or "model"
    return (
        f"step phase={spec.phase} batch={spec.batch} tokens={spec.tokens} "
        f"context={spec.context} model={model_name} mode={spec.mode} tp={spec.tp} "
        f"layers={layers}"
    )


def _dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16,
            "float32": torch.float32}.get(name, torch.bfloat16)


class LlamaStep:
    """Random-weight Llama decoder for one rank, with a static KV cache.

    The KV cache of each layer is `[batch * max_slots, kv_heads, head_dim]`; sequence b owns
    slots `b*max_slots ... b*max_slots + max_slots - 1`, position p lives in slot
    `b*max_slots + p`.
    """

    def __init__(self, card: Card, *, layers: int | None = None, batch: int = 1,
                 max_slots: int = 16, tp: int = 1, rank: int = 0, group=None,
                 device: str | torch.device = "cuda", dtype: torch.dtype | None = None,
                 seed: int = 0, init_std: float = 0.02, shard_from_full: bool = False):
        if card.architecture not in LLAMA_LIKE:
            raise ValueError(f"the torch engine runs Llama-like models, not {card.architecture}")
        self.card = card
        self.layers = int(layers or card.num_hidden_layers)
        self.batch, self.max_slots = int(batch), int(max_slots)
        self.tp, self.rank, self.group = int(tp), int(rank), group
        self.device = torch.device(device)
        self.dtype = dtype or _dtype(card.torch_dtype)
        self.eps = card.rms_norm_eps
        h, d = card.hidden_size, card.head_dim
        if card.num_attention_heads % tp or card.intermediate_size % tp:
            raise ValueError(f"tp={tp} does not divide the heads ({card.num_attention_heads}) "
                             f"and the intermediate size ({card.intermediate_size})")
        self.hq = card.num_attention_heads // tp
        self.hkv = max(1, card.num_key_value_heads // tp)
        self.inter = card.intermediate_size // tp
        self.vocab_local = -(-card.vocab_size // tp)
        self.head_dim = d
        self.hidden = h
        self.shard_from_full = bool(shard_from_full)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed * 1000 + (0 if self.shard_from_full else rank))

        def w(*shape):
            t = torch.empty(*shape, dtype=self.dtype, device=self.device)
            return t.normal_(0.0, init_std, generator=gen)

        def ones(n):
            return torch.ones(n, dtype=self.dtype, device=self.device)

        hq_all, hkv_all, inter_all = card.num_attention_heads, card.num_key_value_heads, \
            card.intermediate_size
        group = hq_all // hkv_all
        q0 = rank * self.hq  # first query head of this rank
        kv0 = q0 // group  # its KV head (KV heads are replicated when fewer than ranks)
        i0 = rank * self.inter
        v0 = rank * self.vocab_local

        def qkv_rows(t):  # rows of this rank's q, k, v heads from the full fused weight
            q = t[q0 * d:(q0 + self.hq) * d]
            k = t[(hq_all + kv0) * d:(hq_all + kv0 + self.hkv) * d]
            v = t[(hq_all + hkv_all + kv0) * d:(hq_all + hkv_all + kv0 + self.hkv) * d]
            return torch.cat([q, k, v]).contiguous()

        def weight(full_shape, local_shape, shard):
            """Per-rank random weights; or, with shard_from_full, this rank's slice of the
            full model's weights (so that any TP width computes the same step: tests)."""
            if self.shard_from_full and tp > 1:
                return shard(w(*full_shape))
            return w(*local_shape) if not self.shard_from_full else w(*full_shape)

        def lm_rows(t):
            out = torch.zeros(self.vocab_local, h, dtype=self.dtype, device=self.device)
            part = t[v0:v0 + self.vocab_local]
            out[:part.shape[0]] = part
            return out

        self.embed = w(card.vocab_size, h)
        qkv_out = (self.hq + 2 * self.hkv) * d
        qkv_full = (hq_all + 2 * hkv_all) * d
        self.layer_weights = []
        for _ in range(self.layers):
            self.layer_weights.append({
                "in_norm": ones(h),
                "qkv": weight((qkv_full, h), (qkv_out, h), qkv_rows),
                "qkv_bias": weight((qkv_full,), (qkv_out,), qkv_rows) if card.qkv_bias else None,
                "o": weight((h, hq_all * d), (h, self.hq * d),
                            lambda t: t[:, q0 * d:(q0 + self.hq) * d].contiguous()),
                "post_norm": ones(h),
                "gate_up": weight((2 * inter_all, h), (2 * self.inter, h),
                                  lambda t: torch.cat([t[i0:i0 + self.inter],
                                                       t[inter_all + i0:inter_all + i0
                                                         + self.inter]]).contiguous()),
                "down": weight((h, inter_all), (h, self.inter),
                               lambda t: t[:, i0:i0 + self.inter].contiguous()),
            })
        self.final_norm = ones(h)
        self.lm_head = weight((card.vocab_size, h), (self.vocab_local, h), lm_rows)
        n_slots = self.batch * self.max_slots
        self.k_cache = [torch.zeros(n_slots, self.hkv, d, dtype=self.dtype, device=self.device)
                        for _ in range(self.layers)]
        self.v_cache = [torch.zeros(n_slots, self.hkv, d, dtype=self.dtype, device=self.device)
                        for _ in range(self.layers)]
        self.cos_sin = ops.make_cos_sin_cache(d, self.max_slots, card.rope_theta,
                                              torch.float32, self.device)

    # -- inputs -----------------------------------------------------------------------
    def decode_inputs(self, context: int, seed: int = 0):
        """Token ids, positions and slots of one decode step at `context` cached tokens."""
        if context + 1 > self.max_slots:
            raise ValueError(f"context {context} does not fit {self.max_slots} slots")
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.card.vocab_size, (self.batch,), generator=g)
        pos = torch.full((self.batch,), context, dtype=torch.long)
        slots = torch.arange(self.batch, dtype=torch.long) * self.max_slots + context
        return ids.to(self.device), pos.to(self.device), slots.to(self.device)

    def prefill_inputs(self, prompt_len: int, seed: int = 0):
        if prompt_len > self.max_slots:
            raise ValueError(f"prompt {prompt_len} does not fit {self.max_slots} slots")
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.card.vocab_size, (self.batch * prompt_len,), generator=g)
        pos = torch.arange(prompt_len, dtype=torch.long).repeat(self.batch)
        slots = (torch.arange(self.batch, dtype=torch.long)[:, None] * self.max_slots
                 + torch.arange(prompt_len, dtype=torch.long)[None, :]).reshape(-1)
        return ids.to(self.device), pos.to(self.device), slots.to(self.device)

    # -- the step ---------------------------------------------------------------------
    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, *,
                phase: str, context: int, return_logits: bool = False):
        """One engine step. decode: `ids` is `[batch]`, attention covers `context + 1`
        positions; prefill: `ids` is `[batch * context]` (prompts of `context` tokens).
        Returns the next token of every sequence (and the logits if asked)."""
        d, hq, hkv = self.head_dim, self.hq, self.hkv
        x = ops.embedding(ids, self.embed)
        residual = None
        for i, lw in enumerate(self.layer_weights):
            if residual is None:
                residual = x
                h = ops.rms_norm(x, lw["in_norm"], self.eps)
            else:
                h, residual = ops.fused_add_rms_norm(x, residual, lw["in_norm"], self.eps)
            qkv = ops.linear(h, lw["qkv"], lw["qkv_bias"])
            q = qkv[:, : hq * d]
            k = qkv[:, hq * d: (hq + hkv) * d]
            v = qkv[:, (hq + hkv) * d:]
            q, k = ops.rotary_embedding(positions, q, k, self.cos_sin)
            ops.reshape_and_cache(k, v, self.k_cache[i], self.v_cache[i], slots)
            if phase == "decode":
                attn = ops.attention_decode(q, self.k_cache[i], self.v_cache[i], context + 1,
                                            hq, hkv, d, self.batch)
            else:
                attn = ops.attention_prefill(q, k, v, hq, hkv, d, self.batch, context)
            x = self._all_reduce(ops.linear(attn, lw["o"]))
            h, residual = ops.fused_add_rms_norm(x, residual, lw["post_norm"], self.eps)
            gate_up = ops.linear(h, lw["gate_up"])
            x = self._all_reduce(ops.linear(ops.silu_and_mul(gate_up), lw["down"]))
        h, _ = ops.fused_add_rms_norm(x, residual, self.final_norm, self.eps)
        if phase == "prefill":  # logits of each prompt's last token only
            h = h.view(self.batch, context, self.hidden)[:, -1]
        logits = ops.linear(h, self.lm_head)
        if self.tp > 1:
            gathered = torch.empty((self.tp * logits.shape[0], logits.shape[1]),
                                   dtype=logits.dtype, device=logits.device)
            if logits.is_cuda:
                dist.all_gather_into_tensor(gathered, logits.contiguous(), group=self.group)
            else:  # gloo (CPU tests) has no all_gather_into_tensor
                dist.all_gather(list(gathered.chunk(self.tp)), logits.contiguous(),
                                group=self.group)
            logits = (gathered.view(self.tp, -1, self.vocab_local).permute(1, 0, 2)
                      .reshape(-1, self.tp * self.vocab_local))
        logits = logits[:, : self.card.vocab_size]
        nxt = ops.argmax(logits)
        return (nxt, logits) if return_logits else nxt


# ---------------------------------------------------------------------------------------
# The profiled run
# ---------------------------------------------------------------------------------------
def say(msg: str, rank: int = 0) -> None:
    if rank == 0:
        print(f"{ENGINE_TAG} {msg}", flush=True)


def _barrier(cpu_group) -> None:
    if cpu_group is not None:
        dist.barrier(group=cpu_group)  # gloo: no CUDA kernel lands in the capture


def _events(on_cuda: bool):
    return (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
        if on_cuda else (None, None)


def time_untraced(one_step, n: int, on_cuda: bool) -> dict:
    """Time `n` warm steps outside the capture range, one at a time from an idle GPU.

    Per step: `host_ns`, the host's time to issue it (the call returns); `wall_ns`, until the
    host has seen the GPU finish (a synchronize after the events); `step_time_ns`, the CUDA
    events recorded just before and after the step: the GPU's own view of the step from its
    start to the end of its last work, which is what the traced step_time_ns measures."""
    from stepscope.ingest.sidecar import stats

    host, wall, gpu = [], [], []
    for _ in range(max(0, n)):
        if on_cuda:
            torch.cuda.synchronize()
        e0, e1 = _events(on_cuda)
        t0 = time.perf_counter_ns()
        if e0 is not None:
            e0.record()
        one_step()
        if e1 is not None:
            e1.record()
        t1 = time.perf_counter_ns()
        if on_cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter_ns()
        host.append(t1 - t0)
        wall.append(t2 - t0)
        gpu.append(e0.elapsed_time(e1) * 1e6 if e0 is not None else t2 - t0)
    return {"method": "CUDA events around each step (step_time_ns), host clock around the call "
                      "(host_ns) and to the synchronize after it (wall_ns); GPU idle before "
                      "each step; outside nsys's capture range",
            "steps": len(gpu), "step_time_ns": stats(gpu), "host_ns": stats(host),
            "wall_ns": stats(wall)}


def run(spec: StepSpec, card: Card, device: str = "cuda") -> dict:
    """Build the model, warm up, time untraced steps, run the profiled step(s). Returns a
    result dict (rank 0)."""
    t0 = time.perf_counter()
    on_cuda = device.startswith("cuda")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if spec.tp != world:
        raise SystemExit(f"tp={spec.tp} but WORLD_SIZE={world}: launch tp>1 through "
                         "python -m torch.distributed.run --nproc-per-node <tp>")
    # Inductor fuses plain ATen ops into its own Triton kernels; our named Triton kernels would
    # stay opaque user kernels inside the compiled graph
    ops.set_backend("torch" if spec.mode == "compiled" else spec.ops)
    group = cpu_group = None
    if on_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if on_cuda else "gloo", device_id=dev if on_cuda else None)
        group = dist.group.WORLD
        cpu_group = dist.new_group(backend="gloo")
    layers = spec.layers or card.num_hidden_layers
    say(f"phase=build model={card.name} layers={layers} tp={spec.tp} device={dev}", rank)
    torch.manual_seed(spec.seed)
    n_steps = max(1, spec.steps)
    # decode steps after the first feed their token back at the next position
    max_slots = spec.context + n_steps if spec.phase == "decode" else spec.context
    model = LlamaStep(card, layers=layers, batch=spec.batch, max_slots=max_slots, tp=spec.tp,
                      rank=rank, group=group, device=dev, seed=spec.seed,
                      shard_from_full=spec.shard_from_full)
    if spec.phase == "decode":
        ids, pos, slots = model.decode_inputs(spec.context, spec.seed)
    else:
        ids, pos, slots = model.prefill_inputs(spec.context, spec.seed)

    def forward():
        return model.forward(ids, pos, slots, phase=spec.phase, context=spec.context)

    step = forward
    if spec.mode == "compiled":
        step = torch.compile(forward)

    say(f"phase=warmup steps={spec.warmup}", rank)
    graph = None
    out = None
    if spec.mode == "graph":
        if not on_cuda:
            raise SystemExit("graph mode needs CUDA")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(1, spec.warmup)):
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for _ in range(max(1, spec.warmup)):
            graph.replay()
    else:
        for _ in range(max(spec.warmup, 2 if spec.mode == "compiled" else 0)):
            out = step()
    if on_cuda:
        torch.cuda.synchronize()
    _barrier(cpu_group)

    def one_step():
        nonlocal out
        if graph is not None:
            graph.replay()
        else:
            out = step()

    untraced = None
    if spec.untraced_steps > 0 and world == 1:
        # the same step shape, warm, outside the capture range: the time users see
        say(f"phase=untraced steps={spec.untraced_steps}", rank)
        untraced = time_untraced(one_step, spec.untraced_steps, on_cuda)
        _barrier(cpu_group)

    name = step_range_name(spec, card.name, layers) if spec.step_name is None else spec.step_name
    say(f"phase=capture range={name!r} steps={n_steps} nvtx={spec.nvtx}", rank)
    nvtx_ctx = torch.autograd.profiler.emit_nvtx() if spec.emit_nvtx and on_cuda else None
    if nvtx_ctx is not None:
        nvtx_ctx.__enter__()
    if on_cuda:
        torch.cuda.profiler.start()
    t_step = time.perf_counter()  # host wall of the step(s) alone (nsys's start excluded)
    tokens = []
    for i in range(n_steps):
        if i and spec.phase == "decode":
            # what an engine loop does between decode steps: the sampled token becomes the next
            # input at the next position (small device-side updates of the static inputs)
            ids.copy_(out.reshape(-1)[: ids.numel()])
            pos.add_(1)
            slots.add_(1)
        if on_cuda and spec.nvtx:
            torch.cuda.nvtx.range_push(name)
        one_step()
        if on_cuda and spec.nvtx:
            torch.cuda.nvtx.range_pop()
        if n_steps > 1:
            tokens.append(out.tolist())  # the sampled tokens go to the host: a sync per step
    if on_cuda:
        torch.cuda.synchronize()
    step_wall = time.perf_counter() - t_step
    _barrier(cpu_group)  # every rank has finished before anyone stops the capture
    if on_cuda:
        torch.cuda.profiler.stop()
    if nvtx_ctx is not None:
        nvtx_ctx.__exit__(None, None, None)
    result = {
        "range": name if spec.nvtx else None,
        "spec": asdict(spec),
        "model": card.name,
        "layers": layers,
        "device": torch.cuda.get_device_name(dev) if on_cuda else "cpu",
        "torch": torch.__version__,
        "triton_ops": ops.use_triton(ids.new_empty(0, dtype=torch.bfloat16)),
        "step_wall_s": round(step_wall, 6),
        "captured_steps": n_steps,
        "step_tokens": tokens or None,
        "total_wall_s": round(time.perf_counter() - t0, 3),
        "next_tokens": out.tolist()[:8] if out is not None else None,
        "untraced": untraced,
    }
    say("result=" + json.dumps(result), rank)
    if world > 1:
        _barrier(cpu_group)
        if graph is not None:
            # Seen on 2×H200 (torch 2.11, NCCL 2.28.9): tearing down NCCL while a captured graph
            # holds its collectives hangs the rank after the step is done (with and without nsys).
            # The capture is complete here, so leave without the teardown.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        dist.destroy_process_group()
    return result


def parse_args(argv: list[str] | None = None) -> tuple[StepSpec, str, str]:
    p = argparse.ArgumentParser(prog="python -m stepscope.capture.engines.torch_engine",
                                description="Run one profiled Llama step (stepscope's torch "
                                "engine). Normally started by `stepscope trace` under nsys.")
    add_step_args(p)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (tests only)")
    p.add_argument("--shard-from-full", action="store_true",
                   help="slice each rank's weights from one full model (tests)")
    p.add_argument("--steps", type=int, default=1,
                   help="steps inside the capture range (each feeds its token to the next)")
    p.add_argument("--step-name", default=None,
                   help="NVTX name of each captured step (default: stepscope's name, which "
                        "records phase, batch, ...; e.g. 'step' for a name without them)")
    p.add_argument("--no-nvtx", action="store_true",
                   help="no NVTX step range: only the capture range marks the step(s)")
    p.add_argument("--ops", choices=["auto", "torch", "triton"], default="auto",
                   help="light ops: auto (named Triton kernels on CUDA), torch (plain ATen "
                        "ops, as an unfused PyTorch model runs them)")
    p.add_argument("--emit-nvtx", action="store_true",
                   help="torch.autograd.profiler.emit_nvtx: an aten:: NVTX range per op")
    a = p.parse_args(argv)
    if a.steps < 1 or a.untraced_steps < 0:
        p.error("--steps must be at least 1 and --untraced-steps at least 0")
    spec = StepSpec(model=a.model, phase=a.phase, batch=a.batch, context=a.context,
                    mode=a.mode, tp=a.tp, layers=a.layers, warmup=a.warmup, seed=a.seed,
                    shard_from_full=a.shard_from_full, steps=a.steps, step_name=a.step_name,
                    nvtx=not a.no_nvtx, ops=a.ops, emit_nvtx=a.emit_nvtx,
                    untraced_steps=a.untraced_steps)
    return spec, a.model, a.device


def main(argv: list[str] | None = None) -> int:
    spec, model, device = parse_args(argv)
    try:
        card = load_card(model)
    except Exception as e:  # InputError: one line
        print(f"{ENGINE_TAG} error={e}", file=sys.stderr, flush=True)
        return 2
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"{ENGINE_TAG} error=no CUDA device visible to torch", file=sys.stderr, flush=True)
        return 3
    run(spec, card, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
