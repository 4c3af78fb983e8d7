#!/usr/bin/env python3
"""Start-up cost of the CLI in two (or more) environments, e.g. with and without a pinned
dependency: each command run N times per environment, environments alternating, median/min/max.

    python benchmarks/startup.py /tmp/venv-typer028 /tmp/venv-typer029 [--runs 10]

Each environment needs stepscope installed (`pip install --no-deps -e .` after its own deps).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

EAGER = Path(__file__).resolve().parent.parent / "fixtures" / "llama8b_decode_b1_eager.sqlite"
COMMANDS = {
    "--help": ["--help"],
    "--version": ["--version"],
    "analyze --json (bundled trace)": ["analyze", "--json"],
    "analyze (terminal, eager fixture)": ["analyze", str(EAGER)],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("venvs", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    exe = [str(v / "bin" / "stepscope") for v in args.venvs]
    for name, argv in COMMANDS.items():
        times: dict[str, list[float]] = {e: [] for e in exe}
        for e in exe:  # warm the page cache
            subprocess.run([e, *argv], capture_output=True, check=True)
        for i in range(args.runs):
            for e in (exe if i % 2 == 0 else exe[::-1]):
                t = time.perf_counter()
                subprocess.run([e, *argv], capture_output=True, check=True)
                times[e].append(time.perf_counter() - t)
        cells = [f"{Path(e).parent.parent.name}: {statistics.median(x):.3f} s ({min(x):.3f}–{max(x):.3f})"
                 for e, x in times.items()]
        print(f"{name:36s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
