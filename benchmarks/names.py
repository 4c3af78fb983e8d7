"""Cost of kernel names (issue 30): an export where every kernel name is distinct, and one whose
names are ~10 MB long, against the same export with its own 15 names, interleaved A B A B in one
process (analyze's whole pipeline, no cache).

    python benchmarks/inflate.py --sizes 200k --out bench-out
    python benchmarks/names.py bench-out/llama8b_decode_b1_eager_200k.sqlite [--distinct 200000] [--runs 3]

The variants are built beside the input (copies; the input is opened read-only): `-distinct`
points each kernel at its own StringIds row ("<its name>_<n>"), `-long` makes one kernel name
`--long-mb` MB long.
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


def timed(path: Path) -> float:
    from stepscope.library import diagnosis

    t = time.perf_counter()
    diagnosis(path, cache=False)  # read, inventory, diagnosis: what analyze runs before drawing
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", type=Path)
    ap.add_argument("--distinct", type=int, default=200_000)
    ap.add_argument("--long-mb", type=float, default=10)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    variants = {"15 names": a.trace, f"{a.distinct:,} distinct names": distinct_copy(a.trace, a.distinct),
                f"a {a.long_mb:g} MB name": long_copy(a.trace, a.long_mb)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(a.runs):
        for k, p in variants.items():
            times[k].append(timed(p))
    base = statistics.median(times["15 names"])
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"{k:>26}: median {m:.2f} s of {len(ts)} ({m / base:.2f}x)")


if __name__ == "__main__":
    main()
