#!/usr/bin/env python3
"""Time and memory of every command against `analyze --json` on the same inflated trace.

Issue 18: `report`, `compare`, `budget`, `export` and the API's step access must stay within
1.3x of `analyze --json`'s wall time and peak RSS. For each size the inflated trace of
benchmarks/run.py (same source fixture, same inflate.py, reused when up to date) is analysed once
to write its Parquet cache, then each command runs `--reps` times in a fresh process (the same
launcher as run.py: wall from fork to reap, peak RSS from os.wait4) and the medians are
compared with `analyze --json`'s, warm like them:

    analyze     stepscope analyze T --json
    report      stepscope report T -o OUT.html
    compare     stepscope compare T T --json        (a trace against itself: both sides read)
    budget      stepscope budget T --cells fixtures/ncu/h200_llama8b_sweep.parquet --json
    export      stepscope export T -o OUT.json
    api.steps   python -c "a = open_trace(T); [a.steps[i] for i in range(len(a.steps))]"
    api.steps, CLI allocator
                the same with _RJEM_MALLOC_CONF set to what the CLI sets for itself
                (stepscope/native.py): like for like, since a library leaves its host's
                allocator as it is and polars' default keeps freed pages for a second
    analyze, polars' allocator
                analyze under polars' own allocator settings: the API's peak against it is
                the other like-for-like comparison (for reference, no bound)
    analyze-all stepscope analyze T --json --steps all   (for reference: every step's figures)

    python benchmarks/commands.py --sizes 1M,5M --reps 3     # writes benchmarks/commands.md

`compare` reads two traces and so is held to 2x in time (two analyses), to 1.3x in memory (one
side's events are let go before the other's are read); the others to 1.3x.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import inflate as _inflate  # noqa: E402
import run as _run  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from stepscope.native import JEMALLOC_CONF  # noqa: E402

POLARS_JEMALLOC_CONF = "dirty_decay_ms:500,muzzy_decay_ms:1000"  # polars 2.1's own (its __init__.py; 1.33: muzzy -1)

REPO = HERE.parent
CELLS = REPO / "fixtures" / "ncu" / "h200_llama8b_sweep.parquet"
API_STEPS = ("import sys; from stepscope import open_trace; a = open_trace(sys.argv[1]); "
             "n = len(a.steps); s = [a.steps[i] for i in range(n)]; print(n, len(s))")


def commands(stepscope: list[str], trace: str, tmp: Path) -> list[tuple[str, list[str], tuple | None, dict]]:
    """(name, command line, allowed ratios to analyze (time, memory), extra environment)."""
    cli_allocator = {"_RJEM_MALLOC_CONF": JEMALLOC_CONF}
    return [
        ("analyze", stepscope + ["analyze", trace, "--json"], (1.0, 1.0), {}),
        ("report", stepscope + ["report", trace, "-o", str(tmp / "r.html")], (1.3, 1.3), {}),
        ("compare", stepscope + ["compare", trace, trace, "--json"], (2.0, 1.3), {}),
        ("budget", stepscope + ["budget", trace, "--cells", str(CELLS), "--json"], (1.3, 1.3), {}),
        ("export", stepscope + ["export", trace, "-o", str(tmp / "e.json")], (1.3, 1.3), {}),
        ("api.steps", [sys.executable, "-c", API_STEPS, trace], (1.3, 1.3), {}),
        ("api.steps, CLI allocator", [sys.executable, "-c", API_STEPS, trace], (1.3, 1.3), cli_allocator),
        # the other like for like: analyze under polars' own allocator defaults (a user's setting wins)
        ("analyze, polars' allocator", stepscope + ["analyze", trace, "--json"], None,
         {"_RJEM_MALLOC_CONF": POLARS_JEMALLOC_CONF}),
        ("analyze-all", stepscope + ["analyze", trace, "--json", "--steps", "all"], None, {}),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M", help="comma list of kernel counts (1M,5M)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=_inflate.DEFAULT_OUT, help="inflated traces folder")
    ap.add_argument("--source", type=Path, default=_inflate.DEFAULT_SOURCE)
    ap.add_argument("--results", type=Path, default=HERE / "commands.md")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args(argv)
    env = _run.child_env(NO_COLOR="1", TERM="dumb")
    stepscope = [sys.executable, "-m", "stepscope"]
    load0 = os.getloadavg()
    lines = ["| trace | command | wall (median) | x analyze | peak RSS | x analyze | bound | ok |",
             "|---|---|---|---|---|---|---|---|"]
    failed = []
    with tempfile.TemporaryDirectory(prefix="stepscope-cmd-bench-") as t:
        tmp = Path(t)
        for size in [_inflate.parse_size(s) for s in args.sizes.split(",") if s.strip()]:
            inf = _inflate.inflate(args.source, size, args.out)
            trace, label = str(inf.path), _inflate.size_label(size)
            print(f"== {label}: {inf.n_kernels:,} kernels", file=sys.stderr)
            r, tail = _run.run_child(stepscope + ["analyze", trace, "--json"], env,
                                     tmp / "warm.json", timeout_s=args.timeout)  # writes the cache
            if r.rc != 0:
                print(f"analyze failed: {tail[-400:]}", file=sys.stderr)
                return 1
            base_wall = base_rss = None
            for name, cmd, bound, extra in commands(stepscope, trace, tmp):
                runs = []
                for _ in range(args.reps):
                    r, tail = _run.run_child(cmd, env | extra, tmp / "out", timeout_s=args.timeout)
                    if r.rc != 0:
                        failed.append(f"{name} {label}: rc {r.rc}: {tail.strip()[-300:]}")
                        break
                    runs.append(r)
                if not runs:
                    continue
                wall = statistics.median(x.wall_s for x in runs)
                rss = statistics.median(x.maxrss_bytes for x in runs)
                if name == "analyze":
                    base_wall, base_rss = wall, rss
                xw, xr = wall / base_wall, rss / base_rss
                ok = "" if bound is None else ("yes" if xw <= bound[0] and xr <= bound[1] else "**no**")
                shown = "-" if bound is None else (f"{bound[0]:g}x" if bound[0] == bound[1]
                                                   else f"{bound[0]:g}x time, {bound[1]:g}x memory")
                lines.append(f"| {label} | `{name}` | {wall:.2f} s | {xw:.2f} | "
                             f"{rss / 2**20:,.0f} MiB | {xr:.2f} | {shown} | {ok} |")
                print(lines[-1], file=sys.stderr)
    load1 = os.getloadavg()
    m = _run.machine_info(REPO)
    head = [f"# Commands against `analyze --json` (warm Parquet cache), {args.reps} fresh runs each",
            "", f"`python benchmarks/commands.py --sizes {args.sizes} --reps {args.reps}` at "
            f"{m['commit']}, {m['date']}: {m['nproc']}-core {m['cpu']}, Python {m['python']}, "
            f"polars {m['polars']}; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at "
            "the end.", ""]
    text = "\n".join(head + lines) + "\n"
    if failed:
        text += "\nfailed:\n" + "\n".join(f"- {f}" for f in failed) + "\n"
    print(text)
    if not args.no_write:
        args.results.write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
