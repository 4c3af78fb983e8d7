#!/usr/bin/env python3
"""A serving run at scale (issue 33, item 10): the real 48-request vLLM graph-mode run
(fixtures/serving/llama-3.1-8b_serve_r48_s0_graph.sqlite.gz, 132 steps, ~48k kernels) inflated to
N kernels by replicating the whole run in time (benchmarks/inflate.py), then analyzed end to end
by the CLI — `stepscope analyze X --json --no-cache` (cold: reading, steps, composition,
diagnosis, the run view) and `stepscope analyze X --json` after a first run wrote the cache (warm)
— in a fresh process per size, interleaved over `--reps` rounds (A B C A B C …: the box is shared
and noisy), each round also timing the two-table SQLite scan of the same file (run.py's floor2:
the kernel table joined to its names and the runtime table, Python sqlite3). Reports per size the
median wall times, each as a ratio to the scan of its own round (the ratio is what holds on a
noisy box), seconds per million kernels (flat when the time is linear) and the peak RSS.

Usage:
    python benchmarks/serving_scale.py --sizes 1M,5M,25M [--reps 2] [--out bench-out]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inflate as _inflate  # noqa: E402
import run as _run  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SOURCE_GZ = REPO / "fixtures" / "serving" / "llama-3.1-8b_serve_r48_s0_graph.sqlite.gz"


def unpacked(out: Path) -> Path:
    """The gzip'd fixture unpacked into `out` once (the fixture itself is never touched)."""
    out.mkdir(parents=True, exist_ok=True)
    dst = out / SOURCE_GZ.name[: -len(".gz")]
    if not dst.exists() or dst.stat().st_mtime < SOURCE_GZ.stat().st_mtime:
        tmp = dst.with_suffix(".part")
        with gzip.open(SOURCE_GZ, "rb") as src, open(tmp, "wb") as f:
            shutil.copyfileobj(src, f, 1 << 20)
        tmp.replace(dst)
    return dst


def scan_once(path: Path) -> float:
    """The two-table SQLite scan of `path` (run.py's floor2), in a fresh connection: seconds."""
    return _run.floor_scan(str(path), both=True)[0]


# run.py's launcher forks the analysis and reports its wall and peak RSS: a child forked by this
# process (which inflated the traces, a few GB at 25M) would start its peak RSS at ours
LAUNCHER = _run.LAUNCHER


def analyze_once(path: Path, cold: bool = True, extra: tuple = ()) -> dict:
    """One end-to-end `analyze --json` in a fresh process (`cold`: with --no-cache; `extra`: more
    options, e.g. `--window-steps 0`, the whole trace at once): wall seconds, peak RSS, steps, run
    view."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    import tempfile

    r, w = os.pipe()
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        p = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(w), sys.executable, "-m", "stepscope", "analyze",
                              str(path), "--json", *(["--no-cache"] if cold else []), *extra],
                             stdout=out, stderr=err, env=env, cwd=REPO, pass_fds=(w,))
        os.close(w)
        p.wait()
        with os.fdopen(r) as f:
            wall, rss_kib, status = f.read().split()
        if int(status) != 0:
            err.seek(0)
            raise SystemExit(f"analyze failed on {path}: {err.read().decode()[-400:]}")
        out.seek(0)
        doc = json.loads(out.read())
    return {"wall_s": float(wall), "steps": len(doc["steps"]), "run": doc.get("run") is not None,
            "rss_mib": int(rss_kib) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1M,5M,25M")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=_inflate.DEFAULT_OUT)
    ap.add_argument("--whole", action="store_true", help="also time the cold run of the whole trace at once "
                    "(--window-steps 0) in each round: the windows' cost and memory against it")
    args = ap.parse_args()
    src = unpacked(args.out)
    sizes = [_inflate.parse_size(s) for s in args.sizes.split(",") if s.strip()]
    built = {n: _inflate.inflate(src, n, args.out) for n in sizes}
    kernels = {n: built[n].counts.get("CUPTI_ACTIVITY_KIND_KERNEL") or built[n].target_kernels for n in sizes}
    runs: dict[int, list[dict]] = {n: [] for n in sizes}
    for n in sizes:  # the cache entry each warm run reads, written once, untimed
        analyze_once(Path(built[n].path), cold=False)
    for _ in range(args.reps):
        for n in sizes:  # interleaved; the scan beside the runs of its round
            path = Path(built[n].path)
            scan = scan_once(path)
            cold, warm = analyze_once(path), analyze_once(path, cold=False)
            whole = analyze_once(path, extra=("--window-steps", "0")) if args.whole else None
            runs[n].append({"scan_s": scan, "cold": cold, "warm": warm, "whole": whole})
    print("| kernels | steps | scan (2 tables) | cold | cold ÷ scan | warm | warm ÷ scan | cold s per M kernels "
          "| peak RSS cold | warm |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        rs = runs[n]
        scan = statistics.median(r["scan_s"] for r in rs)
        cold = statistics.median(r["cold"]["wall_s"] for r in rs)
        warm = statistics.median(r["warm"]["wall_s"] for r in rs)
        xc = statistics.median(r["cold"]["wall_s"] / r["scan_s"] for r in rs)
        xw = statistics.median(r["warm"]["wall_s"] / r["scan_s"] for r in rs)
        rss_c = max(r["cold"]["rss_mib"] for r in rs)
        rss_w = max(r["warm"]["rss_mib"] for r in rs)
        print(f"| {kernels[n]:,} | {rs[0]['cold']['steps']:,} | {scan:.2f} s | {cold:.1f} s | {xc:.1f}× | {warm:.1f} s | "
              f"{xw:.1f}× | {cold / (kernels[n] / 1e6):.2f} | {rss_c:,.0f} MiB | {rss_w:,.0f} MiB |")
    if args.whole:
        print("\n| kernels | cold (as analyze runs it) | cold, the whole trace at once | ratio | peak RSS | peak RSS whole |")
        print("|---:|---:|---:|---:|---:|---:|")
        for n in sizes:
            rs = runs[n]
            c = statistics.median(r["cold"]["wall_s"] for r in rs)
            w = statistics.median(r["whole"]["wall_s"] for r in rs)
            x = statistics.median(r["cold"]["wall_s"] / r["whole"]["wall_s"] for r in rs)
            print(f"| {kernels[n]:,} | {c:.1f} s | {w:.1f} s | {x:.2f}× | {max(r['cold']['rss_mib'] for r in rs):,.0f} MiB "
                  f"| {max(r['whole']['rss_mib'] for r in rs):,.0f} MiB |")


if __name__ == "__main__":
    main()
