"""Cost of kernel names (issue 30): an export where every kernel name is distinct, and one whose
names are ~10 MB long, against the same export with its own 15 names, interleaved A B A B in one
process (analyze's whole pipeline, no cache).

    python benchmarks/inflate.py --sizes 200k --out bench-out
    python benchmarks/names.py bench-out/llama8b_decode_b1_eager_200k.sqlite [--distinct 200000] [--runs 3] [--cli]

The variants are built beside the input (copies; the input is opened read-only): `-distinct`
points each kernel at its own StringIds row ("<its name>_<n>"), `-long` makes one kernel name
`--long-mb` MB long. `--cli` times the whole command instead, each run its own process:
`stepscope analyze T --json --steps all --no-cache` (its JSON to /dev/null), with its peak RSS.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sqlite3
import time
from pathlib import Path

K = "CUPTI_ACTIVITY_KIND_KERNEL"


def distinct_copy(src: Path, n: int) -> Path:
    dst = src.with_name(src.stem + f"-distinct{n}.sqlite")
    if dst.exists():
        return dst
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as c:
        base = c.execute("SELECT MAX(id) FROM StringIds").fetchone()[0] + 1
        # one new name per kernel rowid modulo n: the name it had, with a number
        c.execute(f"INSERT INTO StringIds (id, value) SELECT {base} + (k.rowid % {n}), MIN(s.value) || '_' || "
                  f"(k.rowid % {n}) FROM {K} k JOIN StringIds s ON s.id = k.shortName GROUP BY k.rowid % {n}")
        c.execute(f"UPDATE {K} SET shortName = {base} + (rowid % {n}), demangledName = {base} + (rowid % {n})")
    return dst


def long_copy(src: Path, mb: float) -> Path:
    dst = src.with_name(src.stem + f"-long{mb:g}MB.sqlite")
    if dst.exists():
        return dst
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as c:
        sid = c.execute(f"SELECT shortName FROM {K} LIMIT 1").fetchone()[0]
        c.execute("UPDATE StringIds SET value = value || ? WHERE id = ?", ("x" * int(mb * 1e6), sid))
    return dst


def timed(path: Path) -> tuple[float, float]:
    """(seconds, CPU seconds) of one diagnosis in this process."""
    from stepscope.library import diagnosis

    t, c = time.perf_counter(), time.process_time()
    diagnosis(path, cache=False)  # read, inventory, diagnosis: what analyze runs before drawing
    return time.perf_counter() - t, time.process_time() - c


def timed_cli(path: Path) -> tuple[float, float, float]:
    """(seconds, CPU seconds, peak RSS in MB) of one analyze --json --steps all --no-cache process."""
    import os
    import subprocess
    import sys

    t = time.perf_counter()
    with open(os.devnull, "w") as null:
        p = subprocess.Popen([sys.executable, "-m", "stepscope", "analyze", str(path), "--json", "--steps", "all",
                              "--no-cache"], stdout=null)
        _, status, usage = os.wait4(p.pid, 0)
    if status:
        raise SystemExit(f"{path}: analyze exited with status {status}")
    return time.perf_counter() - t, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", type=Path)
    ap.add_argument("--distinct", type=int, default=200_000)
    ap.add_argument("--long-mb", type=float, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cli", action="store_true", help="time analyze --json --steps all --no-cache processes")
    a = ap.parse_args()
    variants = {"15 names": a.trace, f"{a.distinct:,} distinct names": distinct_copy(a.trace, a.distinct),
                f"a {a.long_mb:g} MB name": long_copy(a.trace, a.long_mb)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    rss: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(a.runs):  # interleaved: A B C A B C ...
        for k, p in variants.items():
            got = timed_cli(p) if a.cli else timed(p)
            times[k].append(got[0])
            cpu[k].append(got[1])
            if a.cli:
                rss[k].append(got[2])
    # CPU time too: on a shared machine another job's load stretches the wall time of a run
    # far more than its CPU time
    base, base_cpu = statistics.median(times["15 names"]), statistics.median(cpu["15 names"])
    for k, ts in times.items():
        m, c = statistics.median(ts), statistics.median(cpu[k])
        peak = f", peak RSS {max(rss[k]):.0f} MB" if rss[k] else ""
        print(f"{k:>26}: median {m:.2f} s ({m / base:.2f}x), CPU {c:.2f} s ({c / base_cpu:.2f}x) of {len(ts)} "
              f"runs{peak}  [{' '.join(f'{t:.2f}' for t in ts)}]")


if __name__ == "__main__":
    main()
