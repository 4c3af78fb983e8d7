"""`stepscope cells`: measure, import and show per-kernel HBM byte cells (ncu)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from stepscope.commands.app import AsJson, Force

cells_app = typer.Typer(
    no_args_is_help=True,
    help="HBM byte cells: per-kernel DRAM bytes measured by ncu (sentinel microbenchmarks).",
)


@cells_app.command("import")
def import_cmd(
    ncu_csv: List[Path] = typer.Argument(..., help="raw `ncu --csv --page raw` outputs"),
    out: Path = typer.Option(..., "-o", "--out", help="cells file (.parquet; a .csv is written next to it)"),
    gpu: Optional[str] = typer.Option(None, help="GPU name, when the CSV does not carry it"),
    model: Optional[str] = typer.Option(None, help="model card the launches belong to"),
    force: Force = False,
) -> None:
    """Turn raw ncu CSV files (==PROF== lines included) into a cells table."""
    from stepscope.bytes.cells import import_ncu, outputs_of, write_cells
    from stepscope.paths import refuse_overwrite
    from stepscope.render.output import is_stdout, target

    if is_stdout(out):
        from stepscope.commands.app import fail

        fail("-o -: cells import writes two files (.parquet and .csv), not stdout; give a file name")
    for written in outputs_of(out):
        target(written, force)  # a device, FIFO or read-only file fails before the CSVs are read
    for written in outputs_of(out):  # -o x.parquet also writes x.csv: neither may be an input
        refuse_overwrite(written, list(ncu_csv))
    df = import_ncu(ncu_csv, gpu=gpu, model=model)
    paths = write_cells(df, out, force=force)
    typer.echo(f"{df.height} launch(es) -> {', '.join(map(str, paths))}")


@cells_app.command("show")
def show_cmd(
    files: List[Path] = typer.Argument(..., help="cells files (.parquet/.csv) or raw ncu CSVs"),
    as_json: AsJson = False,
) -> None:
    """Print the ledger of each profiled launch: read, write, amplification, L2 hit, bandwidth."""
    from stepscope.bytes.cells import gpus_of, ledger, read_many
    from stepscope.bytes.hbm import peak_hbm_bps

    df = read_many(files)
    gpus = gpus_of(df)
    peak = peak_hbm_bps(gpus[0]) if len(gpus) == 1 else None
    led = ledger(df, peak)
    from stepscope.render.bytes import cells_json, render_cells

    if as_json:
        typer.echo(cells_json(led, gpus, peak))
    else:
        render_cells(led, gpus, peak)


@cells_app.command("run")
def run_cmd(
    model: Optional[str] = typer.Option(None, help="card name or config.json (default: the sweep's)"),
    sweep: Optional[Path] = typer.Option(None, help="sweep TOML (default recipes/sweeps/llama_default.toml)"),
    out: Path = typer.Option(Path("cells-out"), help="output folder"),
    cells_per_process: int = typer.Option(0, help="cells per sentinel process: 1 = one ncu call per cell, 0 = all in one"),
    cell: Optional[List[str]] = typer.Option(None, help="run only these cells (repeatable)"),
    smoke: bool = typer.Option(False, help="run the sweep's smoke subset (2-3 cells)"),
    ncu: Optional[str] = typer.Option(None, help="ncu executable"),
    timeout: float = typer.Option(300.0, help="seconds per sentinel process"),
    deadline: Optional[float] = typer.Option(None, help="seconds for the whole sweep; later cells are skipped"),
    print_commands: bool = typer.Option(False, help="print the ncu command lines and exit"),
    engine: Optional[str] = typer.Option(
        None, "--engine", help="vllm or torch: measure every kernel of that engine's real step "
        "(launch order) instead of the sentinel sweep"),
    phase: str = typer.Option("decode", "--phase", help="--engine: decode or prefill"),
    batch: int = typer.Option(1, "--batch", help="--engine: sequences in the step"),
    context: int = typer.Option(2048, "--context", help="--engine: cached tokens / prompt length"),
    mode: str = typer.Option("eager", "--mode", help="--engine: eager or graph"),
    layers: Optional[int] = typer.Option(None, "--layers", help="--engine: run fewer layers"),
    cache_control: str = typer.Option("none", "--cache-control",
                                      help="--engine: ncu's L2 policy between kernels: none "
                                      "(the step's own L2 state) or all (flush: cold L2)"),
    stall: Optional[float] = typer.Option(
        None, "--stall", help="--engine: stop a run that prints nothing for this many seconds "
        "(its stacks go to OUT/ncu.log); default 180 under application replay, off under kernel "
        "replay (ncu prints nothing while it profiles)"),
    kv_cache_gib: Optional[float] = typer.Option(
        None, "--kv-cache-gib", help="--engine vllm: a KV cache of this many GiB instead of 85 % "
        "of the GPU (the step's kernels are the same; ncu keeps the rest)"),
    replay_mode: Optional[str] = typer.Option(
        None, "--replay-mode", help="--engine: ncu's replay mode, kernel or application "
        "(default: application for vllm, whose step gave no result under kernel replay; kernel "
        "for torch)"),
    target_processes: Optional[str] = typer.Option(
        None, "--target-processes", help="--engine: all or application-only (default: "
        "application-only for vllm, all for torch)"),
) -> None:
    """Measure each cell of a sweep under ncu and write OUT/cells.parquet + OUT/cells.csv;
    with --engine, every kernel of one real engine step."""
    options = dict(locals())  # the command line's options, as run_cells takes them
    from stepscope.bytes.cells_run import run_cells

    done = run_cells(**options)
    for line in done.lines:
        typer.echo(line)
    for line in done.errors:
        typer.echo(line, err=True)
    if done.code:
        raise typer.Exit(done.code)

