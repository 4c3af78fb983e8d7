"""Read what `ncu --csv --page raw` prints into one row per profiled launch.

The text ncu writes to stdout: any number of `==PROF==` / `==WARNING==` / `==ERROR==` log
lines and lines of the profiled program, then a CSV block: a header row (`"ID","Process ID",
"Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device",
"CC", <one column per metric>`), a units row (empty for the non-metric columns, `byte`,
`Mbyte`, `nsecond`, `%`, ...), then one row per profiled launch. Numbers may carry thousands
separators (`"113,928,192"`) and `n/a` when a metric could not be collected. Several CSV
blocks may follow one another (raw outputs of several ncu runs concatenated); each is read.
The long `--page details` form (`"Metric Name","Metric Unit","Metric Value"`) is read too.

Values are converted to base units (bytes, nanoseconds) from the units row, so the same
numbers come out whether ncu ran with `--print-units base` or its auto-scaled default.
Unknown or missing metrics are reported, never guessed.

Pure standard library: the sentinel sweep runner uses it before polars is involved.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from stepscope.errors import EnvironmentProblem, InputError
from stepscope.paths import input_file

# metric -> column name in the cells table (units in the name)
METRIC_COLUMNS: dict[str, str] = {
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "gpu__time_duration.sum": "duration_ns",
    "lts__t_sector_hit_rate.pct": "l2_hit_pct",
}
REQUIRED_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
DEFAULT_METRICS = tuple(METRIC_COLUMNS)

_ID_COLS = {
    "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
    "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit",
    "Metric Value", "Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type",
    "Estimated Speedup", "Function Name", "Demangled Name", "Kernel Time",
}

_SCALE = {
    # bytes (ncu prints SI multiples: Kbyte = 1e3 bytes); binary forms accepted too
    "byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
    # time -> nanoseconds
    "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
    "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9,
}

PERM_HELP = (
    "ncu has no permission to read the GPU performance counters (ERR_NVGPUCTRPERM): run as "
    "root, or set `options nvidia NVreg_RestrictProfilingToAdminUsers=0` and reload the driver "
    "(https://developer.nvidia.com/ERR_NVGPUCTRPERM)"
)


@dataclass
class NcuParse:
    """Profiled launches of one or more ncu CSV outputs."""

    launches: list[dict] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)  # metric columns seen, in order
    units: dict[str, str] = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)  # ==PROF==/==ERROR==/== lines
    sources: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [ln for ln in self.log_lines if ln.startswith("==ERROR==")]

    def missing(self, metrics=REQUIRED_METRICS) -> list[str]:
        return [m for m in metrics if m not in self.metrics]


def parse_number(text: str | None, unit: str | None = None) -> float | None:
    """'113,928,192' -> 113928192.0; '1.5' with unit 'Mbyte' -> 1.5e6; 'n/a' / '' -> None."""
    if text is None:
        return None
    t = text.strip().replace(",", "").replace("\u202f", "").replace(" ", "")
    if t == "" or t.lower() in ("n/a", "nan", "-", "none"):
        return None
    try:
        v = float(t)
    except ValueError:
        return None
    if unit:
        v *= _SCALE.get(unit.strip().lower(), 1)
    return v if math.isfinite(v) else None  # 'inf', '1e400': no count of bytes or time


def parse_dim3(text: str | None) -> tuple[int, int, int] | None:
    """'(112, 1, 1)' -> (112, 1, 1)."""
    if not text:
        return None
    # parts are separated by ", "; a part may itself carry a thousands separator ("1,002")
    inner = text.strip().strip("()")
    sep = r",\s+" if re.search(r",\s", inner) else r","
    parts = [p.replace(",", "").strip() for p in re.split(sep, inner)]
    nums = [p for p in parts if p.isdigit()]
    if not nums:
        return None
    vals = [int(n) for n in nums[:3]] + [1] * (3 - min(3, len(nums)))
    return vals[0], vals[1], vals[2]


def _blocks(lines: list[str]) -> list[list[str]]:
    """Split the non-log lines into CSV blocks, each starting at an `"ID",` header."""
    blocks: list[list[str]] = []
    cur: list[str] | None = None
    for ln in lines:
        if ln.startswith('"ID",') or ln.startswith("ID,"):
            cur = [ln]
            blocks.append(cur)
        elif cur is not None and ln.startswith('"'):
            cur.append(ln)
        elif ln.strip() == "":
            continue
        else:
            cur = None  # program output between blocks ends the current one
    return blocks


def parse_text(text: str, source: str = "<text>", into: NcuParse | None = None) -> NcuParse:
    """Parse one ncu output (may hold several CSV blocks). Raises on counter-permission errors."""
    res = into or NcuParse()
    res.sources.append(source)
    lines = text.splitlines()
    log = [ln.strip() for ln in lines if ln.lstrip().startswith("==")]
    res.log_lines.extend(log)
    if "ERR_NVGPUCTRPERM" in text:
        raise EnvironmentProblem(f"{source}: {PERM_HELP}")
    body = [ln for ln in lines if not ln.lstrip().startswith("==")]
    for block in _blocks(body):
        rows = list(csv.reader(io.StringIO("\n".join(block))))
        if not rows:
            continue
        header = rows[0]
        if "Metric Name" in header and "Metric Value" in header:
            _read_long(header, rows[1:], source, res)
        else:
            _read_wide(header, rows[1:], source, res)
    return res


def _base(header: list[str], row: list[str]) -> dict:
    get = dict(zip(header, row))
    grid, block = parse_dim3(get.get("Grid Size")), parse_dim3(get.get("Block Size"))
    d = {
        "id": _int(get.get("ID")),
        "pid": _int(get.get("Process ID")),
        "process": get.get("Process Name") or None,
        "kernel": get.get("Kernel Name") or None,
        "grid": get.get("Grid Size") or None,
        "block": get.get("Block Size") or None,
        "device": _int(get.get("Device")),
        "cc": get.get("CC") or None,
        "stream": _int(get.get("Stream")),
    }
    for k, v in zip(("grid_x", "grid_y", "grid_z"), grid or (None, None, None)):
        d[k] = v
    for k, v in zip(("block_x", "block_y", "block_z"), block or (None, None, None)):
        d[k] = v
    return d


def _int(x: str | None) -> int | None:
    v = parse_number(x)
    return int(v) if v is not None else None


def _read_wide(header: list[str], rows: list[list[str]], source: str, res: NcuParse) -> None:
    metric_cols = [c for c in header if c not in _ID_COLS]
    units: dict[str, str] = {}
    start = 0
    if rows and (rows[0][:1] == [""] or (rows[0] and rows[0][0].strip() == "")):
        units = {h: u for h, u in zip(header, rows[0]) if h in metric_cols}
        start = 1
    for m in metric_cols:
        if m not in res.metrics:
            res.metrics.append(m)
        if m in units and units[m]:
            res.units.setdefault(m, units[m])
    for row in rows[start:]:
        if len(row) < len(header) or not row[0].strip():
            continue
        d = _base(header, row)
        d["source"] = source
        vals = dict(zip(header, row))
        d["metrics"] = {}
        for m in metric_cols:
            raw = vals.get(m)
            num = parse_number(raw, units.get(m))
            d["metrics"][m] = num if num is not None or raw in (None, "", "n/a") else raw
        res.launches.append(d)


def _read_long(header: list[str], rows: list[list[str]], source: str, res: NcuParse) -> None:
    by_id: dict[tuple, dict] = {}
    for row in rows:
        if len(row) < len(header):
            continue
        vals = dict(zip(header, row))
        key = (vals.get("ID"), vals.get("Process ID"))
        if key not in by_id:
            d = _base(header, row)
            d["source"] = source
            d["metrics"] = {}
            by_id[key] = d
        m, unit = vals.get("Metric Name", ""), vals.get("Metric Unit", "")
        if not m:
            continue
        if m not in res.metrics:
            res.metrics.append(m)
        res.units.setdefault(m, unit)
        by_id[key]["metrics"][m] = parse_number(vals.get("Metric Value"), unit)
    res.launches.extend(by_id.values())


def parse_files(paths: list[str | Path], require: tuple[str, ...] = REQUIRED_METRICS) -> NcuParse:
    """Parse several ncu CSV files; raise InputError when nothing usable is there."""
    res = NcuParse()
    for p in paths:
        p = input_file(p, "an ncu CSV (the stdout of ncu --csv --page raw)")
        try:
            text = p.read_text(errors="replace")
        except OSError as e:
            raise InputError(f"{p}: cannot read: {e}") from None
        n0 = len(res.launches)
        parse_text(text, str(p), res)
        if len(res.launches) == n0:
            why = "; ".join(ln for ln in res.log_lines if ln.startswith("==ERROR==")) or (
                "the file is empty" if not text.strip() else "no `\"ID\",...` CSV header")
            raise InputError(
                f"{p}: no profiled launches ({why}). Expected the stdout of "
                "`ncu --csv --page raw --metrics dram__bytes_read.sum,dram__bytes_write.sum ...`")
    check_metrics(res, require)
    return res


def check_metrics(res: NcuParse, require: tuple[str, ...] = REQUIRED_METRICS) -> None:
    missing = res.missing(require)
    if missing:
        raise InputError(
            f"{', '.join(res.sources)}: ncu CSV has no {', '.join(missing)} column "
            f"(captured without them?). Re-run ncu with "
            f"--metrics {','.join(DEFAULT_METRICS)} --csv --page raw")


def launch_record(d: dict) -> dict:
    """Flatten one parsed launch into cells-table columns (base units, named metrics)."""
    out = {k: v for k, v in d.items() if k != "metrics"}
    for m, v in d.get("metrics", {}).items():
        col = METRIC_COLUMNS.get(m, m)
        if isinstance(v, float) and col in ("dram_read_bytes", "dram_write_bytes", "duration_ns"):
            v = int(round(v))
        out[col] = v
    return out
