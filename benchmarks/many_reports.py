#!/usr/bin/env python3
"""Benchmark: 8 reports of 1M kernels each, analyzed as one run, serially vs on a 2-worker
dask LocalCluster (docs/MANY_REPORTS.md has the numbers).

The reports: the eager TP=2 fixture inflated to 2M kernels (benchmarks/inflate.py: whole steps
replicated in time, both ranks), split per rank into two 1M-kernel exports
(benchmarks/split_reports.py), copied under 4 host names: a TP=8 run over 4 nodes. Built once
under bench-out/many/ (every change in copies; the fixture is only read).

Each round runs both modes in one process, interleaved (serial, dask, serial, dask, ...),
reading the SQLite exports (cache off), and checks that both give the same run document.
Also measured: one report's peak RSS in a process of its own (`analyze --json --no-cache`).

    python benchmarks/many_reports.py [--rounds 3] [--workers 2] [--kernels 1M]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import inflate  # noqa: E402
import split_reports  # noqa: E402

SOURCE = REPO / "fixtures" / "llama8b_decode_b1_eager_tp2.sqlite"


def build(kernels_per_report: int, out: Path, hosts: int = 4) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    done = out / f"reports_{inflate.size_label(kernels_per_report)}.json"
    if done.exists():
        paths = [Path(p) for p in json.loads(done.read_text())]
        if all(p.exists() for p in paths):
            return paths
    t = time.perf_counter()
    big = inflate.inflate(SOURCE, 2 * kernels_per_report, out, quiet=True)
    paths = split_reports.run_of(Path(big.path), out / inflate.size_label(kernels_per_report), hosts)
    done.write_text(json.dumps([str(p) for p in paths]))
    print(f"built {len(paths)} reports in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return paths


def one_report_rss(path: Path) -> tuple[float, int]:
    """(seconds, peak RSS bytes) of `stepscope analyze --json --no-cache` of one report, alone."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stepscope", "analyze", "--json", "--no-cache", str(path)], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                       filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    s = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return s, max(peak, before) * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--kernels", default="1M", help="kernels per report")
    ap.add_argument("--out", type=Path, default=REPO / "bench-out" / "many")
    a = ap.parse_args()
    from stepscope import distribute, library
    from stepscope.render.reports_run import run_dict

    paths = build(inflate.parse_size(a.kernels), a.out)
    sizes = [p.stat().st_size for p in paths]
    print(f"{len(paths)} reports, {sum(sizes) / 1e9:.2f} GB of SQLite; {os.cpu_count()} cores", file=sys.stderr)
    s1, rss = one_report_rss(paths[0])
    print(f"one report alone: {s1:.2f} s, peak RSS {rss / 1e9:.2f} GB", file=sys.stderr)

    def serial():
        real = distribute.have_dask
        distribute.have_dask = lambda: False
        try:
            return run_dict(library.run(paths, cache=False))
        finally:
            distribute.have_dask = real

    def on_dask():
        return run_dict(library.run(paths, cache=False, workers=a.workers))

    times = {"serial": [], f"dask {a.workers} workers": []}
    ref = None
    for r in range(a.rounds):
        for name, fn in zip(times, (serial, on_dask)):
            t = time.perf_counter()
            doc = fn()
            times[name].append(time.perf_counter() - t)
            ref = ref or doc
            assert doc == ref, f"{name} differs from the first run"
            print(f"round {r}: {name} {times[name][-1]:.2f} s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [s / d for s, d in zip(*times.values())]
    print(json.dumps({"reports": len(paths), "kernels_per_report": ref["reports"][0]["kernels"],
                      "sqlite_bytes": sum(sizes), "cores": os.cpu_count(),
                      "one_report_s": round(s1, 2), "one_report_peak_rss_bytes": rss,
                      "times_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
                      "median_s": {k: round(v, 2) for k, v in med.items()},
                      "speedup_per_round": [round(x, 2) for x in ratios],
                      "tp_steps": ref["run"]["tp_steps"], "ranks": ref["run"]["ranks"]}, indent=2))


if __name__ == "__main__":
    main()
