"""A hand-built trace whose every figure can be worked out by hand (pipit's "known step").

The export is a real nsys one with its rows replaced: `build(path)` copies the schema (every
table and column nsys 2025.3 writes) of a committed H200 fixture, empties the event tables and
writes three steps of four kernels, one process, one thread, with chosen nanoseconds:

step 0 (range 1,000–10,000): device-bound, one host-bound and one device-side gap
    call   1,100–1,200 → gemm  1,300–2,300      call 1,400–1,500 → norm  2,300–2,400
    call   3,000–3,100 → gemm  3,200–4,200      call 3,300–3,400 → rope  4,500–4,600
step 1 (range 20,000–30,000): a sync gap
    call  20,100–20,200 → gemm 20,300–21,300    call 20,400–20,500 → norm 21,300–22,400
    cudaStreamSynchronize 22,500–22,900 (returns inside the gap 22,400–23,200)
    call  23,000–23,100 → gemm 23,200–24,200    call 23,300–23,400 → rope 24,200–24,300
step 2 (range 40,000–60,000): launch-bound, three host-bound gaps of 4,900
    calls at 40,100 / 45,100 / 50,100 / 55,100 (100 ns each) → 100 ns kernels 100 ns later

KNOWN holds every figure of DEFINITIONS.md for each step, derived by hand in the comments.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "fixtures" / "llama8b_decode_b1_eager.sqlite"
PID, TID = 4242, 4243
GPID = PID << 24
GTID = (PID << 24) | TID
EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_MEMCPY", "NVTX_EVENTS", "PROFILER_OVERHEAD")
NAMES = {"gemm": "nvjet_known_gemm_TNT", "norm": "rms_norm_kernel", "rope": "rotary_embedding_kernel"}
RANGE = "step phase=decode batch=1 tokens=1 context=16 model=known mode=eager tp=1 layers=2"

# (step, kernel class, launch call start, kernel start, kernel end); every call lasts 100 ns
KERNELS = [
    (0, "gemm", 1_100, 1_300, 2_300), (0, "norm", 1_400, 2_300, 2_400),
    (0, "gemm", 3_000, 3_200, 4_200), (0, "rope", 3_300, 4_500, 4_600),
    (1, "gemm", 20_100, 20_300, 21_300), (1, "norm", 20_400, 21_300, 22_400),
    (1, "gemm", 23_000, 23_200, 24_200), (1, "rope", 23_300, 24_200, 24_300),
    (2, "gemm", 40_100, 40_200, 40_300), (2, "norm", 45_100, 45_200, 45_300),
    (2, "gemm", 50_100, 50_200, 50_300), (2, "rope", 55_100, 55_200, 55_300),
]
RANGES = [(1_000, 10_000), (20_000, 30_000), (40_000, 60_000)]
SYNC = (22_500, 22_900)

KNOWN = {
    0: dict(
        n_kernels=4, kernel_time_sum_ns=1_000 + 100 + 1_000 + 100,
        gpu_span_ns=4_600 - 1_300, idle_ns=(3_200 - 2_400) + (4_500 - 4_200),  # 800 + 300
        gpu_busy_ns=3_300 - 1_100,
        step_time_ns=10_000 - 1_000,  # the range's end is later than the last kernel's
        n_launch_calls=4, launch_call_ns=400,
        gaps={"host_bound": (1, 800), "sync": (0, 0), "device_side": (1, 300)},
        # launch starts 1,100 1,400 3,000 3,300: intervals 300, 1,600, 300 -> median 300
        t_launch_ns=300, cpu_floor_ns=1_200,
        # the GPU waits on the host 300 (before 1,300) + 800 (the host-bound gap) + 5,400 (after
        # 4,600, to the range's end) = 6,500 ns, over a quarter of the 9,000 ns step
        host_wait_ns=300 + 800 + 5_400, verdict="host-bound",
        classes={"gemm": (2, 2_000), "norm": (1, 100), "rope": (1, 100)},
    ),
    1: dict(
        n_kernels=4, kernel_time_sum_ns=1_000 + 1_100 + 1_000 + 100,
        gpu_span_ns=24_300 - 20_300, idle_ns=23_200 - 22_400,
        gpu_busy_ns=4_000 - 800,
        step_time_ns=10_000, n_launch_calls=4, launch_call_ns=400,
        # the synchronize returns at 22,900, inside the 22,400-23,200 gap
        gaps={"host_bound": (0, 0), "sync": (1, 800), "device_side": (0, 0)},
        t_launch_ns=300, cpu_floor_ns=1_200,
        # 300 before 20,300 + 5,700 after 24,300 (the sync gap is not the host's per-step work)
        host_wait_ns=300 + 5_700, verdict="host-bound",
        classes={"gemm": (2, 2_000), "norm": (1, 1_100), "rope": (1, 100)},
    ),
    2: dict(
        n_kernels=4, kernel_time_sum_ns=400,
        gpu_span_ns=55_300 - 40_200, idle_ns=3 * 4_900, gpu_busy_ns=400,
        step_time_ns=20_000, n_launch_calls=4, launch_call_ns=400,
        gaps={"host_bound": (3, 14_700), "sync": (0, 0), "device_side": (0, 0)},
        # CPU floor = min(4 launches × 5,000, the launching inside the step: three intervals of
        # 5,000, then the last launch's typical 5,000 cut at the step's end, 60,000 − 55,100)
        t_launch_ns=5_000, cpu_floor_ns=min(4 * 5_000, 3 * 5_000 + 60_000 - 55_100), verdict="launch-bound",
        classes={"gemm": (2, 200), "norm": (1, 100), "rope": (1, 100)},
    ),
}


def _template(con, table: str) -> tuple[list[str], tuple]:
    cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
    row = con.execute(f"SELECT * FROM {table} LIMIT 1").fetchone()
    return cols, row


def _insert(con, table: str, cols: list[str], row: tuple, **values) -> None:
    r = dict(zip(cols, row))
    r.update(values)
    con.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                [r[c] for c in cols])


def build(path: Path) -> Path:
    """Write the known-step export to `path` (a copy of a real export's schema)."""
    path = Path(path)
    shutil.copy(SOURCE, path)
    con = sqlite3.connect(path)
    templates = {t: _template(con, t) for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                                "NVTX_EVENTS")}
    for t in EVENT_TABLES:
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone():
            con.execute(f"DELETE FROM {t}")
    ids = {}

    def sid(text: str) -> int:
        if text not in ids:
            got = con.execute("SELECT id FROM StringIds WHERE value = ?", (text,)).fetchone()
            if got is None:
                new = con.execute("SELECT max(id) + 1 FROM StringIds").fetchone()[0]
                con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (new, text))
                got = (new,)
            ids[text] = got[0]
        return ids[text]

    kc, kr = templates["CUPTI_ACTIVITY_KIND_KERNEL"]
    rc, rr = templates["CUPTI_ACTIVITY_KIND_RUNTIME"]
    nc, nr = templates["NVTX_EVENTS"]
    launch = sid("cudaLaunchKernel_v7000")
    for corr, (_, cls, call, start, end) in enumerate(KERNELS, start=1):
        _insert(con, "CUPTI_ACTIVITY_KIND_RUNTIME", rc, rr, start=call, end=call + 100, globalTid=GTID,
                correlationId=corr, nameId=launch, eventClass=0, returnValue=0)
        name = sid(NAMES[cls])
        _insert(con, "CUPTI_ACTIVITY_KIND_KERNEL", kc, kr, start=start, end=end, deviceId=0, streamId=7,
                correlationId=corr, globalPid=GPID, shortName=name, demangledName=name, mangledName=name,
                gridX=1, gridY=1, gridZ=1, blockX=128, blockY=1, blockZ=1)
    _insert(con, "CUPTI_ACTIVITY_KIND_RUNTIME", rc, rr, start=SYNC[0], end=SYNC[1], globalTid=GTID,
            correlationId=len(KERNELS) + 1, nameId=sid("cudaStreamSynchronize_v3020"), eventClass=0, returnValue=0)
    text = sid(RANGE)
    for start, end in RANGES:
        _insert(con, "NVTX_EVENTS", nc, nr, start=start, end=end, globalTid=GTID, eventType=59,
                text=None, textId=text)
    con.commit()
    con.execute("VACUUM")
    con.close()
    return path
