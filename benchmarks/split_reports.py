#!/usr/bin/env python3
"""Make the reports of one run from one multi-rank export: one SQLite file per process.

`nsys profile -o report_%q{RANK}` (one nsys session per rank) writes one export per rank; the
committed TP=2 fixtures hold both ranks in one. `split_by_process` copies the export once per
process and, inside each COPY, deletes with SQL every row of the other processes (every table
with a globalPid or globalTid column). The session start and the host stay, so the copies are
on one clock, as one host's per-rank sessions are. `copy_as_host` copies a report and renames
its host (TARGET_INFO_SYSTEM_ENV's Hostname): the reports of another node of the same run.
`shift_clock` moves a copy's session start by `ns` and every timestamp by −`ns`: the same
events, recorded by a session that started at another time. The source is never written.

    python benchmarks/split_reports.py fixtures/llama8b_decode_b1_eager_tp2.sqlite OUT_DIR [--hosts 4]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
from pathlib import Path

# globalPid / globalTid pack <hw:8><vm:8><pid:24><tid:24>
_PID = "(({col} >> 24) & 16777215)"
TIME_COLUMNS = ("start", "end", "timestamp")


def _tables(con: sqlite3.Connection) -> list[str]:
    return [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def processes_with_kernels(src: Path) -> list[int]:
    con = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    try:
        return [r[0] for r in con.execute(
            f"SELECT DISTINCT {_PID.format(col='globalPid')} FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1")]
    finally:
        con.close()


def split_by_process(src: Path, out_dir: Path, stem: str | None = None) -> list[Path]:
    """One copy of `src` per process that ran kernels, holding only that process's rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = stem or src.stem
    out = []
    for rank, pid in enumerate(processes_with_kernels(src)):
        dst = out_dir / f"{stem}_rank{rank}.sqlite"
        shutil.copyfile(src, dst)
        con = sqlite3.connect(dst)
        try:
            for t in _tables(con):
                cols = _columns(con, t)
                for col in ("globalPid", "globalTid"):
                    if col in cols:
                        con.execute(f'DELETE FROM "{t}" WHERE {col} IS NOT NULL AND {_PID.format(col=col)} != ?', (pid,))
            con.commit()
            con.execute("VACUUM")
        finally:
            con.close()
        out.append(dst)
    return out


def copy_as_host(src: Path, dst: Path, host: str) -> Path:
    shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    try:
        con.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", (host,))
        con.commit()
    finally:
        con.close()
    return dst


def shift_clock(src: Path, dst: Path, ns: int) -> Path:
    """A copy whose session started `ns` later and whose timestamps are `ns` smaller."""
    shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    try:
        con.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", (ns,))
        for t in _tables(con):
            if not (t.startswith("CUPTI_ACTIVITY_KIND_") or t.startswith("NVTX_EVENTS") or t == "PROFILER_OVERHEAD"):
                continue
            for c in TIME_COLUMNS:
                if c in _columns(con, t):
                    con.execute(f'UPDATE "{t}" SET "{c}" = "{c}" - ? WHERE "{c}" IS NOT NULL', (ns,))
        con.commit()
    finally:
        con.close()
    return dst


def run_of(src: Path, out_dir: Path, hosts: int = 1) -> list[Path]:
    """The per-rank reports of `src` on `hosts` nodes (copies of the ranks under other host names)."""
    ranks = split_by_process(src, out_dir / "split")
    out = []
    for h in range(hosts):
        for r in ranks:
            out.append(copy_as_host(r, out_dir / f"node{h}_{r.name}", f"node{h}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--hosts", type=int, default=1)
    a = ap.parse_args()
    for p in run_of(a.source, a.out, a.hosts):
        print(p)


if __name__ == "__main__":
    main()
