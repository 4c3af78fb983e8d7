"""Where a report's clock stands: what puts the reports of one run on one timeline.

An nsys export's timestamps are nanoseconds from its own session's start; the session's start
is recorded as UTC epoch nanoseconds (TARGET_INFO_SESSION_START_TIME.utcEpochNs), and the host
it ran on in TARGET_INFO_SYSTEM_ENV (name Hostname). Reports of one `nsys profile` session
share the start (every process of a session is on its timeline); reports of separate sessions
(`srun nsys profile -o report_%q{SLURM_PROCID} …`, one per rank) each have their own, and
utcEpochNs + t puts them on the hosts' UTC clocks: one clock on one host, NTP/PTP-synchronized
clocks across nodes (docs/DEFINITIONS.md, "Reports of one run").

A PyTorch-profiler trace records neither: its offset is 0 and its host unknown.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SessionClock:
    start_utc_ns: int | None  # the session's start, UTC epoch ns (None: not recorded)
    host: str | None          # the host the session ran on (None: not recorded)


def session_clock(path: str | Path) -> SessionClock:
    """The session start and host of an nsys SQLite export (read-only); (None, None) for any
    other file, or an export that lacks the tables."""
    from stepscope.ingest.nsys_sqlite import connect_readonly, is_sqlite

    path = Path(path)
    try:
        if not is_sqlite(path):
            return SessionClock(None, None)
        con = connect_readonly(path)
    except (OSError, sqlite3.Error):
        return SessionClock(None, None)
    try:
        start = _one(con, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
        host = _one(con, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1")
    finally:
        con.close()
    return SessionClock(start if isinstance(start, int) else None, host if isinstance(host, str) else None)


def _one(con: sqlite3.Connection, sql: str):
    try:
        row = con.execute(sql).fetchone()
    except sqlite3.Error:  # the table is absent (an old or trimmed export)
        return None
    return row[0] if row else None


@dataclass(frozen=True)
class SessionSpan:
    """How long an nsys session recorded (ANALYSIS_DETAILS), on the export's event clock."""

    duration_ns: int          # ANALYSIS_DETAILS.duration: the session's length
    end_ns: int               # where the session ends on the clock of the export's events


def _open(path: str | Path) -> sqlite3.Connection | None:
    """A read-only connection to an SQLite export, or None for any other file: a FIFO, socket or
    device is never opened (a read of one blocks: the reader refused it)."""
    from stepscope.ingest.nsys_sqlite import connect_readonly, is_sqlite

    path = Path(path)
    try:
        if not path.is_file() or not is_sqlite(path):
            return None
        return connect_readonly(path)
    except (OSError, sqlite3.Error):
        return None


def session_span(path: str | Path, last_event_ns: int | None = None) -> SessionSpan | None:
    """The session's length and end of an nsys SQLite export (read-only); None for any other
    file, or an export without ANALYSIS_DETAILS. nsys 2025's exports time their events from the
    collection's start, so the session ends at `duration`; an export whose events lie past that
    (events timed from the session's start, as some exports are) ends at stopTime instead:
    `last_event_ns`, the latest event, tells which."""
    con = _open(path)
    if con is None:
        return None
    try:
        row = con.execute("SELECT duration, stopTime FROM ANALYSIS_DETAILS LIMIT 1").fetchone()
    except (sqlite3.Error, UnicodeError, ValueError):  # the table or a column absent, a damaged schema
        row = None
    finally:
        con.close()
    if not row or not isinstance(row[0], int) or row[0] <= 0:
        return None
    duration, stop = row
    end = duration
    if last_event_ns is not None and last_event_ns > duration and isinstance(stop, int) and stop >= last_event_ns:
        end = stop
    return SessionSpan(duration, end)


def cuda_processes(path: str | Path) -> list[tuple[int, str | None, int]] | None:
    """For an nsys SQLite export that recorded no kernel (its kernel table absent or empty, and
    no CUDA-graph replay either): the processes that made CUDA calls, (pid, name, calls), most
    calls first. None for any other file (one with kernels included)."""
    con = _open(path)
    if con is None:
        return None
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"):
            if t in tables and con.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone():
                return None
        if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
            return []
        rows = con.execute("SELECT globalTid / 16777216 % 16777216 AS pid, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                           "GROUP BY pid ORDER BY count(*) DESC, pid").fetchall()
        names = {}
        if "PROCESSES" in tables:
            names = dict(con.execute("SELECT pid, name FROM PROCESSES").fetchall())
    except (sqlite3.Error, UnicodeError, ValueError):  # a damaged export: the reader's own line stands
        return None
    finally:
        con.close()
    return [(int(p), names.get(p) if isinstance(names.get(p), str) else None, int(n)) for p, n in rows
            if isinstance(p, int)]
