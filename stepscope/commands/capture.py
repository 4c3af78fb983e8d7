"""Live capture commands: `stepscope trace`, `stepscope models`, `stepscope doctor`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from stepscope.commands.app import AsJson


def trace(
    model: str = typer.Option("llama-3.1-8b", "--model", "-m",
                              help="bundled model card (see `stepscope models`) or a config.json"),
    engine: Optional[str] = typer.Option(None, "--engine",
                                         help="vllm or torch (default: vllm when installed, and always for MoE/MLA models)"),
    mode: str = typer.Option("eager", "--mode",
                             help="eager, graph, both, or compiled (torch.compile; torch engine)"),
    phase: str = typer.Option("decode", "--phase", help="decode or prefill"),
    batch: int = typer.Option(1, "--batch", help="sequences in the step"),
    context: int = typer.Option(2048, "--context",
                                help="decode: tokens already cached; prefill: prompt length"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel width (GPUs)"),
    layers: Optional[int] = typer.Option(None, "--layers",
                                         help="run fewer layers than the model has"),
    out: Path = typer.Option(Path("stepscope-out"), "--out", "-o",
                             help="folder for the .nsys-rep, .sqlite and engine log"),
    warmup: int = typer.Option(3, "--warmup", hidden=True),
    untraced_steps: Optional[int] = typer.Option(
        None, "--untraced-steps",
        help="steps of the same shape timed outside the capture range, for the untraced "
             "figures of the .stepscope.json sidecar (0: none; default: the engine's)"),
    steps: int = typer.Option(1, "--steps", help="torch engine: steps inside the capture range"),
    step_name: Optional[str] = typer.Option(
        None, "--step-name", help="torch engine: NVTX name of each step (e.g. 'step')"),
    no_nvtx: bool = typer.Option(False, "--no-nvtx",
                                 help="torch engine: no NVTX step range (capture range only)"),
    ops: Optional[str] = typer.Option(
        None, "--ops", help="torch engine: light ops auto|torch|triton (torch: unfused ATen)"),
    emit_nvtx: bool = typer.Option(False, "--emit-nvtx",
                                   help="torch engine: PyTorch's emit_nvtx (aten:: ranges)"),
    inductor_names: Optional[str] = typer.Option(
        None, "--inductor-names",
        help="vLLM graph mode: Inductor's triton.descriptive_names (original_aten|torch|"
             "inductor_node)"),
    sync_scheduling: bool = typer.Option(
        False, "--sync-scheduling", help="vLLM: async scheduling off (the step `cells run "
        "--engine vllm` measures under ncu)"),
    kv_cache_gib: Optional[float] = typer.Option(
        None, "--kv-cache-gib", help="vLLM: a KV cache of this many GiB instead of 85 % of the GPU"),
    quantization: Optional[str] = typer.Option(
        None, "--quantization", help="vLLM: its quantization method (e.g. fp8: dynamic FP8 of "
        "the dummy bf16 weights)"),
    requests: Optional[int] = typer.Option(
        None, "--requests", help="vLLM: a serving-like run of this many requests (continuous "
        "batching, chunked prefill) inside the capture range instead of one step"),
    prompt_lens: Optional[str] = typer.Option(
        None, "--prompt-lens", help="with --requests: prompt tokens drawn from A:B "
        "(default 16:3000)"),
    output_lens: Optional[str] = typer.Option(
        None, "--output-lens", help="with --requests: output tokens drawn from A:B "
        "(default 4:96)"),
    seed: int = typer.Option(0, "--seed", help="with --requests: the workload's seed"),
    as_json: AsJson = False,
) -> None:
    """Run one engine step (or, with --requests, a serving-like run) under Nsight Systems and
    explain where its time goes."""
    options = dict(locals())  # the command line's options, as trace_request takes them
    from stepscope.capture.run import run_trace, trace_request

    captures = run_trace(trace_request(**options))
    _show(captures, as_json)


def _show(captures, as_json: bool) -> None:
    """Each capture's analysis (and, with --mode both, eager against graph); the first failed
    analysis' exit code."""
    comparison = _compare_modes(captures)
    if as_json:
        doc = {"captures": [c.to_dict() for c in captures]}
        if comparison is not None:
            doc["compare"] = comparison
        typer.echo(json.dumps(doc, indent=2))
    else:
        for c in captures:
            if len(captures) > 1:
                typer.echo(f"== {c.mode} ({c.sqlite}) ==")
            typer.echo(c.analysis if isinstance(c.analysis, str) else json.dumps(c.analysis))
        if comparison is not None:
            from stepscope.render.terminal import render_compare

            typer.echo("== eager vs graph ==")
            render_compare(comparison)
    failed = [c for c in captures if c.analysis_rc not in (0, None)]
    if failed:
        raise typer.Exit(failed[0].analysis_rc or 1)


def _compare_modes(captures) -> dict | None:
    """With --mode both: `stepscope compare` of the eager capture (A) against the graph one (B)."""
    by_mode = {c.mode: c for c in captures}
    if set(by_mode) != {"eager", "graph"} or not all(c.sqlite.exists() for c in captures):
        return None
    from stepscope import library
    from stepscope.errors import StepscopeError

    try:
        return library.compare(by_mode["eager"].sqlite, by_mode["graph"].sqlite)
    except StepscopeError as e:
        typer.echo(f"stepscope: warning: no eager-vs-graph comparison: {e}", err=True)
        return None


def models(as_json: AsJson = False) -> None:
    """List the bundled model cards (shapes only, no weights)."""
    from stepscope.capture.models import list_cards

    cards = [c.summary() for c in list_cards()]
    if as_json:
        typer.echo(json.dumps(cards, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="model cards (or --model path/to/config.json)", box=None)
    t.add_column("name", no_wrap=True, min_width=max(len(c["name"]) for c in cards))
    for col in ("layers", "hidden", "attention", "MLP", "params"):
        t.add_column(col, justify="right", no_wrap=True)
    for c in cards:
        active = f"/{c['active_params'] / 1e9:.1f}B" if c["experts"] else ""
        layers = (f"{c['dense_layers']}+{c['moe_layers']}" if c["experts"] and c["dense_layers"]
                  else str(c["num_hidden_layers"]))
        t.add_row(c["name"], layers, str(c["hidden_size"]), _attention_cell(c), _mlp_cell(c),
                  f"{c['params'] / 1e9:.1f}B{active}")
    console = Console()
    console.print(t)
    console.print("layers: dense+MoE where both; attention: heads/KV heads×head dim, or MLA's KV cache per token "
                  "and layer (kv_lora_rank+qk_rope_head_dim); MLP: intermediate size, or routed(+shared) "
                  "experts×expert width and top-k; params: total/active per token (--json: every field)",
                  highlight=False)


def _attention_cell(c: dict) -> str:
    if c["kv_lora_rank"]:
        return f"MLA kv {c['kv_lora_rank']}+{c['qk_rope_head_dim']}"
    return f"{c['num_attention_heads']}/{c['num_key_value_heads']}×{c['head_dim']}"


def _mlp_cell(c: dict) -> str:
    if not c["experts"]:
        return str(c["intermediate_size"])
    shared = f"+{c['shared_experts']}" if c["shared_experts"] else ""
    return f"{c['experts']}{shared}×{c['expert_intermediate_size']} top{c['experts_per_token']}"


def doctor(as_json: AsJson = False) -> None:
    """What this machine can capture: nsys, ncu, GPUs, torch/CUDA, vLLM."""
    from stepscope.capture.doctor import diagnose, render

    d = diagnose()
    if as_json:
        typer.echo(json.dumps(d, indent=2))
        return
    from rich.console import Console

    render(d, Console())
