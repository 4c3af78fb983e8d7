"""What the cache's checksums cost on a hit (issue 30): a warm read of an export's entry, against
the SHA-256 of its Parquet files alone, interleaved A B A B in one process.

    python benchmarks/inflate.py --sizes 1M --out bench-out
    python benchmarks/cache_checksum.py bench-out/llama8b_decode_b1_eager_1M.sqlite [--runs 5]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from pathlib import Path

from stepscope.ingest import cache, read_trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    t = read_trace(a.trace, cache=True)  # makes the entry when there is none
    entry = t.cache_entry or next(d for d in (a.trace.resolve().parent / ".stepscope-cache").iterdir()
                                  if d.name.startswith(a.trace.stem))
    size = sum(f.stat().st_size for f in entry.glob("*.parquet"))
    hit, sums = [], []
    for _ in range(a.runs):
        s = time.perf_counter()
        got = read_trace(a.trace, cache=True)
        hit.append(time.perf_counter() - s)
        assert got.cache_entry is None  # a hit
        s = time.perf_counter()
        for f in cache.FRAMES:
            hashlib.sha256((entry / f"{f}.parquet").read_bytes()).hexdigest()
        sums.append(time.perf_counter() - s)
    h, c = statistics.median(hit), statistics.median(sums)
    print(f"{t.kernels.height:,} kernels, entry {size / 2**20:.1f} MiB: warm read {h * 1e3:.0f} ms (median of "
          f"{a.runs}), of which SHA-256 of the files {c * 1e3:.0f} ms ({100 * c / h:.1f}%)")


if __name__ == "__main__":
    main()
