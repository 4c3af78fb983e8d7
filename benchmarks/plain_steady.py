#!/usr/bin/env python3
"""A plain `vllm serve` capture at scale: the scoped plain capture of fixtures/serving/
(`llama1b_serve_r16_graph_plain_scopes`: no step range, vLLM's `schedule: …` ranges, 99 engine
iterations after a 48 s start-up) without its start-up (every event that starts before its first
scheduler range is deleted, in a copy), then replicated in time to N kernels by inflate.py: a long
serving run of engine iterations only, as a ten-minute capture of a warm server holds them (the
whole capture replicated would put a start-up inside an iteration of every copy).

`--bare` deletes every NVTX range of the steady copy (bare.sqlite) before it is replicated: a plain
capture without vLLM's scopes, whose steps are the engine loop's (found once from a light read of the
run, then analyzed by windows: docs/PERFORMANCE.md).

`--with-startup` replicates the whole capture instead (as scopes.sqlite): each copy's 48 s start-up
then lies inside the last iteration of the copy before, an iteration of thousands of host pauses
and GPU gaps, the shape that made the pauses' joins quadratic (analysis/pauses.py; docs/CHANGELOG).

Usage:
    python benchmarks/plain_steady.py --sizes 5M [--out bench-out/plain]
then, e.g.:
    /usr/bin/time -f "%e s %M KB" stepscope analyze bench-out/plain/steady_5M.sqlite --json --no-cache > a.json
    /usr/bin/time -f "%e s %M KB" stepscope analyze bench-out/plain/steady_5M.sqlite --json --no-cache --window-steps 0 > b.json
    python benchmarks/plain_steady.py --sizes 300k,5M --with-startup   # bench-out/plain/scopes_*.sqlite
    python benchmarks/plain_steady.py --sizes 5M,25M --bare             # bench-out/plain/bare_*.sqlite
"""
from __future__ import annotations

import argparse
import gzip
import shutil
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inflate as _inflate  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SOURCE_GZ = REPO / "fixtures" / "serving" / "llama1b_serve_r16_graph_plain_scopes.sqlite.gz"


def steady(out: Path, bare: bool = False) -> Path:
    """The fixture unpacked into `out` as steady.sqlite, its start-up deleted (the fixture is never
    touched); `bare`: as bare.sqlite, every NVTX range deleted too."""
    out.mkdir(parents=True, exist_ok=True)
    dst = out / ("bare.sqlite" if bare else "steady.sqlite")
    with gzip.open(SOURCE_GZ, "rb") as src, open(dst, "wb") as f:
        shutil.copyfileobj(src, f, 1 << 20)
    con = sqlite3.connect(dst)
    try:
        t0 = con.execute("SELECT min(e.start) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                         "WHERE coalesce(e.text, s.value) GLOB 'schedule: *'").fetchone()[0]
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                                            "(name LIKE 'CUPTI_ACTIVITY_KIND_%' OR name = 'NVTX_EVENTS')")]
        for t in tables:
            if "start" in {r[1] for r in con.execute(f"PRAGMA table_info({t})")}:
                con.execute(f"DELETE FROM {t} WHERE start < ?", (t0,))
        if bare:
            con.execute("DELETE FROM NVTX_EVENTS")
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()
    return dst


def whole(out: Path) -> Path:
    """The fixture unpacked into `out` as scopes.sqlite, start-up and all."""
    out.mkdir(parents=True, exist_ok=True)
    dst = out / "scopes.sqlite"
    with gzip.open(SOURCE_GZ, "rb") as src, open(dst, "wb") as f:
        shutil.copyfileobj(src, f, 1 << 20)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="5M")
    ap.add_argument("--out", type=Path, default=_inflate.DEFAULT_OUT / "plain")
    ap.add_argument("--with-startup", action="store_true", help="replicate the whole capture, start-up included")
    ap.add_argument("--bare", action="store_true", help="the steady copy without any NVTX range")
    args = ap.parse_args()
    src = whole(args.out) if args.with_startup else steady(args.out, bare=args.bare)
    for s in args.sizes.split(","):
        r = _inflate.inflate(src, _inflate.parse_size(s), args.out)
        print(r.path, r.counts.get("CUPTI_ACTIVITY_KIND_KERNEL"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
