"""`stepscope cells run`: measure byte cells under ncu, either the sentinel sweep's cells or
(`--engine`) every kernel of one real engine step, and write OUT/cells.parquet + OUT/cells.csv.
Options are checked before ncu starts; what the command prints comes back as an Outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stepscope.errors import InputError

SWEEP_TIMEOUT_S = 300.0  # the option's default: per sentinel process
STEP_TIMEOUT_S = 540.0   # an engine step under ncu, when the timeout is left at its default


@dataclass
class Outcome:
    """What `cells run` prints: lines on stdout, lines on stderr, its exit code."""

    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    code: int = 0


def run_cells(*, engine: str | None, model: str | None, out: Path, print_commands: bool, ncu: str | None,
              timeout: float, **options) -> Outcome:
    """One `cells run` command line: the engine step's kernels with `engine`, else the sweep."""
    if engine is not None:
        return run_step(engine, model or "llama-3.1-8b", out=out, ncu=ncu, print_commands=print_commands,
                        timeout=timeout if timeout != SWEEP_TIMEOUT_S else STEP_TIMEOUT_S, **options)
    return run_sweep_cells(model, out=out, ncu=ncu, print_commands=print_commands, timeout=timeout, **options)


def run_sweep_cells(model: str | None, *, sweep: Path | None, out: Path, cells_per_process: int,
                    cell: list[str] | None, smoke: bool, ncu: str | None, timeout: float,
                    deadline: float | None, print_commands: bool, **_step_options) -> Outcome:
    """Each cell of a sweep under ncu (the --engine options are not the sweep's)."""
    from stepscope import options as opt
    from stepscope.bytes import sweep as sw

    opt.number(timeout, "--timeout", 1, 7 * 86_400)
    opt.number(deadline, "--deadline", 1, 30 * 86_400)
    s = sw.load_sweep(sweep)
    _dense_only(model or s.model)
    names = list(cell or []) or (s.smoke if smoke else None)
    specs = s.select(names)
    if print_commands:
        return Outcome([" ".join(sw.cell_command(ncu or "ncu", s, spec, model)) for spec in specs])
    from stepscope.bytes.cells import frame, write_cells

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sweep.log", "a") as log:
        res = sw.run_sweep(s, out, model=model, cells=names, cells_per_process=cells_per_process, ncu=ncu,
                           timeout_s=timeout, log=log, deadline_s=deadline)
    paths = write_cells(frame(res.rows), out / "cells")
    ok = len(specs) - len(res.failed)
    done = Outcome([f"{ok}/{len(specs)} cells measured on {res.gpu or 'unknown GPU'} (ncu {res.ncu_version}) in "
                    f"{res.seconds:.0f} s -> {', '.join(map(str, paths))}"], code=0 if ok else 1)
    if res.failed:
        done.errors.append(f"failed: {', '.join(res.failed)} (see {out / 'sweep.log'})")
    return done


def check_step_options(phase: str, cache_control: str, batch: int, context: int, stall: float | None,
                       kv_cache_gib: float | None) -> None:
    """--engine's options, before the engine starts."""
    from stepscope import options as opt

    if phase not in ("decode", "prefill"):
        raise InputError(f"--phase {phase!r}: decode or prefill")
    if cache_control not in ("none", "all"):
        raise InputError(f"--cache-control {cache_control!r}: none or all")
    for name, v in (("batch", batch), ("context", context)):
        if v < 1:
            raise InputError(f"--{name} must be at least 1 (got {v})")
    opt.number(stall, "--stall", 1, 86_400)
    opt.number(kv_cache_gib, "--kv-cache-gib", 0.01, 4096)


def _dense_only(model: str) -> None:
    """A sweep's cells are a dense decoder layer's ops (GQA attention, one MLP): an MoE or MLA
    model's kernels are measured on its own step instead."""
    from stepscope.bytes.minbytes import shape_of

    s = shape_of(model)
    if s.experts or s.kv_lora:
        kind = "a mixture of experts" if s.experts else "MLA"
        raise InputError(f"{model} is {kind}: the sweep measures a dense layer's ops; measure the model's own "
                         "step with `stepscope cells run --engine vllm --model …`")


def run_step(engine: str, model: str, *, phase: str, batch: int, context: int, mode: str, layers: int | None,
             out: Path, ncu: str | None, timeout: float, cache_control: str, print_commands: bool,
             stall: float | None = None, kv_cache_gib: float | None = None, replay_mode: str | None = None,
             target_processes: str | None = None, **_sweep_options) -> Outcome:
    """Every kernel of one real engine step under ncu (launch order), its progress on stderr."""
    from stepscope.bytes import stepcells
    from stepscope.capture.models import load_card

    check_step_options(phase, cache_control, batch, context, stall, kv_cache_gib)
    card = load_card(model)
    if engine == "torch" and (card.is_moe or card.is_mla):
        raise InputError(f"the torch engine runs Llama-like dense models; {card.name} is "
                         f"{'a mixture of experts' if card.is_moe else 'MLA'}: use --engine vllm")
    if print_commands:
        app = stepcells.engine_command(engine, model, phase=phase, batch=batch, context=context,
                                       mode=mode, layers=layers, kv_cache_gib=kv_cache_gib)
        rm, tp = stepcells.ncu_settings(engine, replay_mode, target_processes)
        return Outcome([" ".join(stepcells.ncu_command(ncu or "ncu", app, cache_control=cache_control,
                                                       replay_mode=rm, target_processes=tp))])
    from rich.console import Console

    from stepscope.bytes.cells import frame, write_cells

    label = f"{card.name} {phase} b={batch} {mode} ({engine}) under ncu"
    with Console(stderr=True).status(f"{label}: starting the engine") as status:
        def progress(n: int, s: float, what: str = "kernels profiled") -> None:
            status.update(f"{label}: {n} {what}, {s:.0f} s")

        res = stepcells.run_step_cells(engine, model, phase=phase, batch=batch, context=context, mode=mode,
                                       layers=layers, out=out, ncu=ncu, timeout_s=timeout,
                                       cache_control=cache_control, on_progress=progress, stall_s=stall,
                                       kv_cache_gib=kv_cache_gib, replay_mode=replay_mode,
                                       target_processes=target_processes)
    paths = write_cells(frame(res.rows), out / "cells")
    passes = ", ".join(f"{n} kernel(s) in {p} pass(es)" for p, n in sorted(res.passes.items()))
    return Outcome([f"{len(res.rows)} kernels of one {phase} step measured on {res.gpu or 'unknown GPU'} "
                    f"(ncu {res.ncu_version}) in {res.seconds:.0f} s" + (f" ({passes})" if passes else "")
                    + f" -> {', '.join(map(str, paths))}"])
