#!/usr/bin/env python3
"""A serving run at scale (issue 33, item 10): the real 48-request vLLM graph-mode run
(fixtures/serving/llama-3.1-8b_serve_r48_s0_graph.sqlite.gz, 132 steps, ~48k kernels) inflated to
N kernels by replicating the whole run in time (benchmarks/inflate.py), then analyzed end to end
by the CLI — `stepscope analyze X --json --no-cache`: reading, steps, composition, diagnosis,
the run view — in a fresh process per size, interleaved over `--reps` rounds (A B C A B C …: the
box is shared and noisy). Reports per size the median wall time, seconds per million kernels
(flat when the time is linear in kernels) and the peak RSS, as a Markdown table.

Usage:
    python benchmarks/serving_scale.py --sizes 1M,2.5M,5M [--reps 2] [--out bench-out]
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


def analyze_once(path: Path) -> dict:
    """One end-to-end `analyze --json` in a fresh process: wall seconds, peak RSS, steps, run view."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    import tempfile

    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "stepscope", "analyze", str(path), "--json", "--no-cache"],
                             stdout=subprocess.PIPE, stderr=err, env=env, cwd=REPO)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)  # this child's own peak RSS
        wall = time.perf_counter() - t
        p.stdout.close()
        if status != 0:
            err.seek(0)
            raise SystemExit(f"analyze failed on {path}: {err.read().decode()[-400:]}")
    doc = json.loads(out)
    return {"wall_s": wall, "steps": len(doc["steps"]), "run": doc.get("run") is not None,
            "rss_mib": usage.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1M,2.5M,5M")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=_inflate.DEFAULT_OUT)
    args = ap.parse_args()
    src = unpacked(args.out)
    sizes = [_inflate.parse_size(s) for s in args.sizes.split(",") if s.strip()]
    built = {n: _inflate.inflate(src, n, args.out) for n in sizes}
    kernels = {n: built[n].counts.get("CUPTI_ACTIVITY_KIND_KERNEL") or built[n].target_kernels for n in sizes}
    runs: dict[int, list[dict]] = {n: [] for n in sizes}
    for _ in range(args.reps):
        for n in sizes:  # interleaved
            runs[n].append(analyze_once(Path(built[n].path)))
    print("| kernels | steps | run view | wall (median) | s per M kernels | peak RSS |")
    print("|---:|---:|---|---:|---:|---:|")
    for n in sizes:
        w = statistics.median(r["wall_s"] for r in runs[n])
        rss = max((r["rss_mib"] or 0) for r in runs[n])
        print(f"| {kernels[n]:,} | {runs[n][0]['steps']:,} | {'yes' if runs[n][0]['run'] else 'no'} | {w:.1f} s | "
              f"{w / (kernels[n] / 1e6):.1f} | {rss:,.0f} MiB |")


if __name__ == "__main__":
    main()
