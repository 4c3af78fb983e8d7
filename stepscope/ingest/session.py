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
