"""Independent reference figures computed in plain SQL, never with stepscope's own code."""

from __future__ import annotations

import sqlite3

PID = "((({c}) >> 24) & 16777215)"
TID = "(({c}) & 16777215)"

LAUNCH_LIKE = ("cudaLaunch%", "cuLaunch%", "cudaGraphLaunch%", "cuGraphLaunch%")


def activity_union_sql(where: str) -> str:
    """busy/span/idle of the kernels+memops selected by `where` (columns start, end), in SQL."""
    return f"""
    WITH a AS (
        SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE {where.format(t='k')}
        UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE {where.format(t='m')}
        {{memset}}
    ), o AS (
        SELECT start, end,
               max(end) OVER (ORDER BY start, end ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
        FROM a
    )
    SELECT max(end) - min(start) AS span,
           sum(CASE WHEN prev IS NOT NULL AND start > prev THEN start - prev ELSE 0 END) AS idle,
           count(*) AS n
    FROM o"""


def union_figures(con: sqlite3.Connection, where: str) -> dict:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    memset = (f"UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET s WHERE {where.format(t='s')}"
              if "CUPTI_ACTIVITY_KIND_MEMSET" in tables else "")
    sql = activity_union_sql(where).replace("{memset}", memset)
    if "CUPTI_ACTIVITY_KIND_MEMCPY" not in tables:
        sql = sql.replace(
            f"UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE {where.format(t='m')}", "")
    span, idle, n = con.execute(sql).fetchone()
    return {"span": span, "idle": idle, "busy": span - idle, "n": n}
