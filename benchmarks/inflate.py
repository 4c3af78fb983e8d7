#!/usr/bin/env python3
"""Inflate a real nsys SQLite export to N kernels by replicating its step in time.

The fixture is copied first; every change happens inside the COPY (the source is opened
read-only and never written).  Inside the copy, each CUPTI activity table
(CUPTI_ACTIVITY_KIND_KERNEL, _RUNTIME, _MEMSET, _MEMCPY, and any other CUPTI_ACTIVITY_KIND_*
table present: _SYNCHRONIZATION, _CUDA_EVENT, _DRIVER, ...) and the bounded NVTX ranges
(the ``step ...`` range, and per-layer ranges such as ``ncclAllReduce`` in the TP=2 fixture)
are replicated ``copies - 1`` times:

* replica k (k = 1 .. copies-1) is shifted in time by ``k * (period + gap)`` where
  ``period = max(end) - min(start)`` over every replicated row;
* ``correlationId`` is offset by ``k * (max correlationId + 1)`` (same stride in every table,
  so each kernel still joins its launch call on (process, correlationId));
* ``gridId`` is offset by ``k * (max gridId + 1)`` so it stays unique, as at run time;
* everything else (StringIds references, devices, streams, processes, threads, graph node ids)
  is unchanged, so the schema and the string table stay valid.

NVTX rows without an end (marks, domain creations) are not replicated.  ANALYSIS_DETAILS'
duration/stopTime are stretched to cover the inflated span.

Every replication is one ``INSERT ... SELECT`` over a temp numbers table built by a recursive
CTE, so 5M kernels builds in well under a minute on the 2-core box.  The result is checked by
SQL counts (``verify``).

Usage:
    python benchmarks/inflate.py --sizes 10k,100k,1M [--source fixtures/...sqlite] [--out bench-out]
    python benchmarks/inflate.py --sizes 1M --source fixtures/llama8b_decode_b1_eager_tp2.sqlite
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO / "fixtures" / "llama8b_decode_b1_eager.sqlite"
DEFAULT_OUT = REPO / "bench-out"
DEFAULT_GAP_NS = 100_000  # idle time between consecutive replicas (100 us)
FORMAT_VERSION = 1  # bump when the inflation changes, so stale outputs are rebuilt

_SUFFIX = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def parse_size(text: str) -> int:
    """'10k' -> 10_000, '1M' -> 1_000_000, '5m' -> 5_000_000, '420' -> 420."""
    t = text.strip().lower().replace("_", "")
    if not t:
        raise ValueError("empty size")
    mult = 1
    if t[-1] in _SUFFIX:
        mult = _SUFFIX[t[-1]]
        t = t[:-1]
    value = float(t) * mult
    if value < 1:
        raise ValueError(f"size must be >= 1: {text!r}")
    return int(round(value))


def size_label(n: int) -> str:
    for suffix, mult in (("M", 1_000_000), ("k", 1_000)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA table_info({_q(table)})")]


def _replicated_tables(con: sqlite3.Connection) -> list[str]:
    rows = con.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'CUPTI_ACTIVITY_KIND_%' "
        "ORDER BY name"
    ).fetchall()
    return [r[0] for r in rows]


# Rows of NVTX_EVENTS that get replicated: bounded ranges inside the replicated window.
_NVTX_WHERE = "{a}end IS NOT NULL AND {a}start >= {t0} AND {a}end <= {t1}"


@dataclass
class InflateResult:
    source: str
    path: str
    target_kernels: int
    copies: int
    base: dict = field(default_factory=dict)  # table -> rows in the source
    counts: dict = field(default_factory=dict)  # table -> rows in the inflated copy
    period_ns: int = 0
    gap_ns: int = 0
    corr_stride: int = 0
    grid_stride: int = 0
    build_s: float = 0.0
    format_version: int = FORMAT_VERSION

    @property
    def n_kernels(self) -> int:
        return self.counts.get("CUPTI_ACTIVITY_KIND_KERNEL", 0)


def _source_plan(con: sqlite3.Connection) -> dict:
    """Window, strides and base row counts of the source."""
    tables = _replicated_tables(con)
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        raise SystemExit("source has no CUPTI_ACTIVITY_KIND_KERNEL table")
    t0, t1, max_corr, max_grid = None, None, -1, -1
    base: dict[str, int] = {}
    for t in tables:
        cols = _columns(con, t)
        base[t] = con.execute(f"SELECT count(*) FROM {_q(t)}").fetchone()[0]
        if "start" in cols and "end" in cols:
            lo, hi = con.execute(f"SELECT min(start), max(end) FROM {_q(t)}").fetchone()
            if lo is not None:
                t0 = lo if t0 is None else min(t0, lo)
                t1 = hi if t1 is None else max(t1, hi)
        if "correlationId" in cols:
            m = con.execute(f"SELECT max(correlationId) FROM {_q(t)}").fetchone()[0]
            if m is not None:
                max_corr = max(max_corr, m)
        if "gridId" in cols:
            m = con.execute(f"SELECT max(gridId) FROM {_q(t)}").fetchone()[0]
            if m is not None:
                max_grid = max(max_grid, m)
    has_nvtx = con.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='NVTX_EVENTS'"
    ).fetchone() is not None
    nvtx_rows = 0
    if has_nvtx:
        # Widen the window to the NVTX ranges that overlap it (a step range may start before
        # its first launch call and end after its last kernel).
        lo, hi = con.execute(
            "SELECT min(start), max(end) FROM NVTX_EVENTS WHERE end IS NOT NULL "
            "AND end >= ? AND start <= ?", (t0, t1)
        ).fetchone()
        if lo is not None:
            t0, t1 = min(t0, lo), max(t1, hi)
        nvtx_rows = con.execute(
            "SELECT count(*) FROM NVTX_EVENTS WHERE " + _NVTX_WHERE.format(a="", t0=t0, t1=t1)
        ).fetchone()[0]
        base["NVTX_EVENTS"] = nvtx_rows
    return {
        "tables": tables,
        "base": base,
        "t0": t0,
        "t1": t1,
        "max_corr": max_corr,
        "max_grid": max_grid,
        "has_nvtx": has_nvtx,
    }


def _meta_path(dst: Path) -> Path:
    return dst.with_suffix(dst.suffix + ".json")


def _fresh(dst: Path, source: Path, target: int, gap_ns: int) -> InflateResult | None:
    meta = _meta_path(dst)
    if not dst.exists() or not meta.exists():
        return None
    try:
        info = json.loads(meta.read_text())
    except (OSError, ValueError):
        return None
    st = source.stat()
    if (
        info.get("format_version") != FORMAT_VERSION
        or info.get("source") != str(source.resolve())
        or info.get("source_size") != st.st_size
        or info.get("source_mtime_ns") != st.st_mtime_ns
        or info.get("target_kernels") != target
        or info.get("gap_ns") != gap_ns
        or info.get("size") != dst.stat().st_size
    ):
        return None
    res = InflateResult(**{k: v for k, v in info.items() if k in InflateResult.__dataclass_fields__})
    res.path = str(dst)
    return res


def inflate(
    source: Path,
    target_kernels: int,
    out_dir: Path = DEFAULT_OUT,
    gap_ns: int = DEFAULT_GAP_NS,
    force: bool = False,
    quiet: bool = False,
) -> InflateResult:
    """Build (or reuse) ``out_dir/<source stem>_<size>.sqlite`` with >= target_kernels kernels.

    Whole steps are replicated, so the kernel count is ``copies * base`` with
    ``copies = ceil(target / base)`` (e.g. 1M from 420 kernels -> 2381 copies, 1,000,020).
    """
    source = Path(source)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / f"{source.stem}_{size_label(target_kernels)}.sqlite"
    if dst.resolve() == source.resolve():
        raise SystemExit("refusing to write over the source")
    if not force:
        cached = _fresh(dst, source, target_kernels, gap_ns)
        if cached is not None:
            if not quiet:
                print(f"reuse {dst} ({cached.n_kernels:,} kernels)", file=sys.stderr)
            return cached

    t_start = time.perf_counter()
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        plan = _source_plan(src)
    finally:
        src.close()
    base = plan["base"]
    k_base = base["CUPTI_ACTIVITY_KIND_KERNEL"]
    if k_base == 0:
        raise SystemExit("source has no kernels")
    copies = max(1, math.ceil(target_kernels / k_base))
    t0, t1 = plan["t0"], plan["t1"]
    period = (t1 - t0) + gap_ns
    corr_stride = plan["max_corr"] + 1
    grid_stride = plan["max_grid"] + 1

    tmp = dst.with_name(dst.name + ".tmp")
    for p in (tmp, dst, _meta_path(dst)):
        if p.exists():
            p.unlink()
    shutil.copyfile(source, tmp)
    os.chmod(tmp, 0o644)

    con = sqlite3.connect(tmp, isolation_level=None)
    try:
        for pragma in (
            "journal_mode=OFF",
            "synchronous=OFF",
            "temp_store=MEMORY",
            "cache_size=-262144",  # 256 MiB page cache
            "locking_mode=EXCLUSIVE",
        ):
            con.execute(f"PRAGMA {pragma}")
        con.execute("BEGIN")
        if copies > 1:
            con.execute(
                "CREATE TEMP TABLE _rep(k INTEGER PRIMARY KEY) "
            )
            con.execute(
                "INSERT INTO _rep(k) WITH RECURSIVE n(k) AS "
                "(SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < ?) SELECT k FROM n",
                (copies - 1,),
            )
            work = list(plan["tables"]) + (["NVTX_EVENTS"] if plan["has_nvtx"] else [])
            for t in work:
                if base.get(t, 0) == 0:
                    continue
                cols = _columns(con, t)
                where = ""
                if t == "NVTX_EVENTS":
                    where = " WHERE " + _NVTX_WHERE.format(a="", t0=t0, t1=t1)
                con.execute(f"CREATE TEMP TABLE _base AS SELECT * FROM main.{_q(t)}{where} ORDER BY rowid")
                exprs = []
                for c in cols:
                    qc = "b." + _q(c)
                    if c in ("start", "end"):
                        exprs.append(f"{qc} + r.k * {period}")
                    elif c == "correlationId":
                        exprs.append(f"{qc} + r.k * {corr_stride}")
                    elif c == "gridId":
                        exprs.append(f"{qc} + r.k * {grid_stride}")
                    else:
                        exprs.append(qc)
                # CROSS JOIN keeps _rep as the outer loop: rows come out replica by replica,
                # each replica in the source's row order (time-sorted like a real export).
                con.execute(
                    f"INSERT INTO main.{_q(t)} ({', '.join(_q(c) for c in cols)}) "
                    f"SELECT {', '.join(exprs)} FROM _rep AS r CROSS JOIN temp._base AS b"
                )
                con.execute("DROP TABLE temp._base")
            # Stretch the capture duration over the inflated span.
            has_ad = con.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='ANALYSIS_DETAILS'"
            ).fetchone()
            if has_ad:
                ad_cols = set(_columns(con, "ANALYSIS_DETAILS"))
                extra = (copies - 1) * period
                if "duration" in ad_cols:
                    con.execute(f"UPDATE ANALYSIS_DETAILS SET duration = duration + {extra}")
                if "stopTime" in ad_cols:
                    con.execute(f"UPDATE ANALYSIS_DETAILS SET stopTime = stopTime + {extra}")
            con.execute("DROP TABLE temp._rep")
        con.execute("COMMIT")
    finally:
        con.close()
    os.replace(tmp, dst)
    build_s = time.perf_counter() - t_start

    res = InflateResult(
        source=str(source.resolve()),
        path=str(dst),
        target_kernels=target_kernels,
        copies=copies,
        base=dict(base),
        period_ns=period,
        gap_ns=gap_ns,
        corr_stride=corr_stride,
        grid_stride=grid_stride,
        build_s=round(build_s, 3),
    )
    res.counts = verify(dst, res)
    st = source.stat()
    meta = asdict(res) | {
        "source_size": st.st_size,
        "source_mtime_ns": st.st_mtime_ns,
        "size": dst.stat().st_size,
    }
    _meta_path(dst).write_text(json.dumps(meta, indent=1))
    if not quiet:
        print(
            f"built {dst} : {res.n_kernels:,} kernels ({copies} copies of {k_base}) "
            f"in {build_s:.1f} s, {dst.stat().st_size / 2**20:.0f} MiB",
            file=sys.stderr,
        )
    return res


def verify(path: Path, res: InflateResult) -> dict:
    """SQL checks of an inflated copy; returns the row counts. Raises AssertionError on mismatch."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        counts = {}
        for t, n in res.base.items():
            got = con.execute(f"SELECT count(*) FROM {_q(t)}").fetchone()[0]
            counts[t] = got
            if t == "NVTX_EVENTS":
                # the non-replicated rows (marks, unbounded ranges) stay once
                total_src = sqlite3.connect(f"file:{res.source}?mode=ro", uri=True)
                try:
                    all_src = total_src.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
                finally:
                    total_src.close()
                want = all_src + (res.copies - 1) * n
            else:
                want = res.copies * n
            assert got == want, f"{t}: {got} rows, expected {want}"
        k = "CUPTI_ACTIVITY_KIND_KERNEL"
        n_corr, lo, hi = con.execute(
            f"SELECT count(DISTINCT correlationId), min(start), max(end) FROM {k}"
        ).fetchone()
        src = sqlite3.connect(f"file:{res.source}?mode=ro", uri=True)
        try:
            b_corr, b_lo, b_hi = src.execute(
                f"SELECT count(DISTINCT correlationId), min(start), max(end) FROM {k}"
            ).fetchone()
            b_strings = src.execute("SELECT count(*) FROM StringIds").fetchone()[0]
        finally:
            src.close()
        assert n_corr == res.copies * b_corr, f"distinct correlationIds {n_corr} != {res.copies}*{b_corr}"
        assert lo == b_lo, "first kernel moved"
        assert hi == b_hi + (res.copies - 1) * res.period_ns, "last kernel not where expected"
        strings = con.execute("SELECT count(*) FROM StringIds").fetchone()[0]
        assert strings == b_strings, "StringIds changed"
        bad_names = con.execute(
            f"SELECT count(*) FROM (SELECT DISTINCT shortName FROM {k}) d "
            "LEFT JOIN StringIds s ON s.id = d.shortName WHERE s.id IS NULL"
        ).fetchone()[0]
        assert bad_names == 0, "kernel names not in StringIds"
        return counts
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real nsys SQLite export")
    ap.add_argument("--sizes", default="10k,100k,1M", help="comma list of kernel counts (10k,100k,1M,5M)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default bench-out/)")
    ap.add_argument("--gap-ns", type=int, default=DEFAULT_GAP_NS, help="idle ns between replicas")
    ap.add_argument("--force", action="store_true", help="rebuild even when an up-to-date copy exists")
    args = ap.parse_args(argv)
    for s in args.sizes.split(","):
        if s.strip():
            r = inflate(args.source, parse_size(s), args.out, args.gap_ns, force=args.force)
            print(json.dumps({"path": r.path, "kernels": r.n_kernels, "copies": r.copies,
                              "build_s": r.build_s, "counts": r.counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
