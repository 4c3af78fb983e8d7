"""Reader for PyTorch-profiler (Kineto) chrome traces: `.json` or `.json.gz` → `Trace`.

Written by `torch.profiler.profile(...).export_chrome_trace`, `tensorboard_trace_handler`
and vLLM's torch profiler. What is read (everything else is ignored):

  cat "kernel"                       → kernels (device, stream, grid, block from `args`)
  cat "gpu_memcpy" / "gpu_memset"    → memops (bytes from `args`)
  cat "cuda_runtime" / "cuda_driver" → api rows (runtime and driver calls, like nsys)
  cat "user_annotation"              → nvtx rows (`ProfilerStep#N`, vLLM's `execute_…`,
                                       any `record_function` range) so step segmentation works
  ph "M" process_name                → processes;  top-level `deviceProperties` → gpus

GPU activities and their launching calls are joined on `args["correlation"]` (CUPTI's
correlation id, unique within the profiled process). Kineto writes GPU rows with the device
index as `pid`; the model wants the launching process there, so each GPU row takes the pid of
its launching call (the host process of the trace when the call is missing).

Timestamps are microseconds with a fractional part; they are converted to integer
nanoseconds exactly from the decimal text (round(ts * 1000) on floats would lose the last
nanosecond on traces whose clock is ~5e12 µs).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections import Counter
from pathlib import Path

import polars as pl

from stepscope.errors import InputError
import stepscope.ingest.sanity as sanity  # the module, not the package: no circle through ingest/__init__
from stepscope.paths import input_file
from stepscope.model import (
    API_SCHEMA, GPU_SCHEMA, KERNEL_SCHEMA, MEMOP_SCHEMA, NVTX_SCHEMA, PROCESS_SCHEMA,
    STRING_SCHEMA, Trace, empty,
)

KERNEL_CATS = {"kernel"}
MEMOP_CATS = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# torch.profiler names a copy "Memcpy HtoD (Pageable -> Device)": its direction as nsys's copyKind
_COPY_KINDS = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "HtoH": 9, "PtoP": 10}


def _copy_kind(name: str | None) -> int | None:
    for word, kind in _COPY_KINDS.items():
        if word in (name or ""):
            return kind
    return None
API_CATS = {"cuda_runtime", "cuda_driver"}
# cpu_op: the aten:: op around each launch, as emit_nvtx writes it under nsys (framework ops)
ANNOTATION_CATS = {"user_annotation", "cpu_op"}


# |ns| below 2^62, the bound every reader keeps (ingest/sanity.py); ids of the model's widths
_TIME_BOUND = 1 << 62
_I32 = 1 << 31
_I64 = 1 << 63


def ns(v) -> int | None:
    """Kineto µs (int, or the decimal text kept by the JSON parser) → integer ns, exactly.
    None for anything that is not a finite number of µs within ±2^62 ns: NaN, Infinity, 1e400,
    text, a bool, a list."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        out = v * 1000
    elif isinstance(v, float):
        if not math.isfinite(v):
            return None
        out = round(v * 1000)
    elif isinstance(v, str):
        out = _decimal_ns(v.strip())
        if out is None:
            return None
    else:
        return None
    return out if -_TIME_BOUND < out < _TIME_BOUND else None


def _decimal_ns(s: str) -> int | None:
    if len(s) > 64 or not s.isascii():  # no time has more digits (int() of thousands is slow)
        return None
    neg = s.startswith("-")
    whole, dot, frac = s.lstrip("+-").partition(".")
    if not (whole or frac) or not (whole.isdigit() or not whole) or not (frac.isdigit() or not frac):
        try:  # exponent notation: through float, as before
            f = float(s)
        except ValueError:
            return None
        return round(f * 1000) if math.isfinite(f) else None
    frac += "000"
    out = int(whole or "0") * 1000 + int(frac[:3])
    if frac[3:4] and int(frac[3]) >= 5:  # round half up on the sub-ns digits
        out += 1
    return -out if neg else out


def _int(v, bound: int = _I64) -> int | None:
    """An integer id from an int or its text; None when it is something else or does not fit
    the model's column (`bound`: 2^31 for Int32 columns, 2^63 for Int64)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        out = v
    elif isinstance(v, (str, float)):
        text = str(v).strip()
        if len(text) > 40:
            return None
        try:
            out = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                return None
            if not math.isfinite(f):
                return None
            out = int(f)
    else:
        return None
    return out if -bound <= out < bound else None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(v) -> tuple[str, bool]:
    """A name as polars can hold it, and whether it had to change: JSON's \\ud800 escapes give
    Python strings with lone surrogates, which are not UTF-8 (polars refused the whole column)."""
    s = v if isinstance(v, str) else str(v)
    if s.isascii():
        return s, False
    try:
        s.encode("utf-8")
        return s, False
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", s), True


def _dim3(v) -> tuple[int | None, int | None, int | None]:
    if isinstance(v, (list, tuple)):
        vals = [_int(x) for x in list(v)[:3]]
        return tuple(vals + [1] * (3 - len(vals)))  # type: ignore[return-value]
    return (None, None, None)


def load_json(path: Path) -> object:
    """Parse a .json or .json.gz trace, keeping floats as their decimal text."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise InputError(
                f"{path} is a damaged or truncated gzip file ({e}); copy or export the trace again"
            ) from None
    try:
        # NaN and Infinity (Python's json takes them) become nulls: no time is either
        return json.loads(raw, parse_float=str, parse_constant=lambda name: None)
    except RecursionError:
        raise InputError(f"{path} is JSON nested too deeply to be a PyTorch-profiler trace") from None
    except UnicodeDecodeError:
        raise InputError(f"{path} is not a PyTorch-profiler trace (not UTF-8 JSON)") from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path} is not valid JSON ({e.msg} at line {e.lineno}); the trace may be truncated: "
            "export it again"
        ) from None


def _events(doc: object, path: Path) -> list[dict]:
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events = doc["traceEvents"]
    elif isinstance(doc, list) and doc and all(isinstance(e, dict) and "ph" in e for e in doc[:100]):
        events = doc  # chrome-trace "JSON array" form
    else:
        raise InputError(
            f"{path} is JSON but not a PyTorch-profiler (Kineto) trace: it has no traceEvents list; "
            "give a trace written by torch.profiler's export_chrome_trace"
        )
    return [e for e in events if isinstance(e, dict)]


class _Strings:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def id(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.ids)
        return i

    def frame(self) -> pl.DataFrame:
        if not self.ids:
            return empty(STRING_SCHEMA)
        return pl.DataFrame({"id": list(self.ids.values()), "value": list(self.ids)}, schema=STRING_SCHEMA)


def read_kineto(path: str | Path) -> Trace:
    path = input_file(path, "a .json or .json.gz PyTorch-profiler trace")
    doc = load_json(path)
    events = _events(doc, path)
    strings = _Strings()
    kernels: list[tuple] = []
    memops: list[tuple] = []
    api: list[tuple] = []
    nvtx: list[tuple] = []
    processes: dict[int, str] = {}
    skipped: Counter = Counter()  # why events were left out
    no_args = 0  # events whose args are not an object: read without them
    bad_names = 0  # names with lone surrogates, read with U+FFFD
    kernel_events = 0

    for e in events:
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "process_name":
                pid = _int(e.get("pid"), _I32)
                meta = e.get("args")
                name = meta.get("name") if isinstance(meta, dict) else None
                if pid is not None and isinstance(name, str):
                    processes.setdefault(pid, _text(name)[0])
            continue
        cat = e.get("cat")
        if ph != "X" or not isinstance(cat, str):
            continue
        if cat not in KERNEL_CATS and cat not in MEMOP_CATS and cat not in API_CATS and cat not in ANNOTATION_CATS:
            continue
        kernel_events += cat in KERNEL_CATS
        start, dur = ns(e.get("ts")), ns(e.get("dur"))
        if start is None or dur is None:
            skipped["ts or dur is not a finite number of µs"] += 1
            continue
        end = start + dur  # a negative dur is left out, counted, by sanity.checked
        args = e.get("args")
        if not isinstance(args, dict):
            no_args += args is not None
            args = {}
        name, changed = _text(e.get("name", ""))
        bad_names += changed
        if cat in API_CATS or cat in ANNOTATION_CATS:
            pid, tid = _int(e.get("pid"), _I32), _int(e.get("tid"), _I32)
            if pid is None or tid is None:
                skipped["pid or tid is not a 32-bit integer"] += 1
                continue
            if cat in API_CATS:
                api.append((pid, tid, _int(args.get("correlation")), start, end, strings.id(name)))
            else:
                nvtx.append((pid, tid, start, end, name))
            continue
        corr = _int(args.get("correlation"))
        device = _int(args.get("device"), _I32)
        if device is None:
            device = _int(e.get("pid"), _I32)
        stream = _int(args.get("stream"), _I32)
        if stream is None:
            stream = _int(e.get("tid"), _I32)
        if cat in KERNEL_CATS:
            sid = strings.id(name)
            gx, gy, gz = _dim3(args.get("grid"))
            bx, by, bz = _dim3(args.get("block"))
            node = _int(args.get("graph node id"))
            kernels.append((None, device, stream, corr, start, end, sid, sid, gx, gy, gz, bx, by, bz,
                            node if node else None))
        else:
            memops.append((None, device, stream, corr, start, end, MEMOP_CATS[cat], _int(args.get("bytes")),
                           _copy_kind(name) if cat == "gpu_memcpy" else None))

    if not kernels:
        if kernel_events:
            raise InputError(f"{path}: none of its {kernel_events:,} kernel events has a usable ts and dur "
                             "(NaN, Infinity, text or out of range): export the trace again")
        kinds = "no events" if not events else f"{len(events)} events but no GPU kernel events (cat 'kernel')"
        raise InputError(
            f"{path} is a trace with {kinds}: profile with "
            "torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])"
        )

    api_df = pl.DataFrame(api, schema=list(API_SCHEMA.items()), orient="row") if api else empty(API_SCHEMA)
    kern = pl.DataFrame(kernels, schema=list(KERNEL_SCHEMA.items()), orient="row")
    mem = pl.DataFrame(memops, schema=list(MEMOP_SCHEMA.items()), orient="row") if memops else empty(MEMOP_SCHEMA)
    host_pid = _host_pid(api_df, nvtx, processes)
    kern, mem = _launching_pid(kern, api_df, host_pid), _launching_pid(mem, api_df, host_pid)

    warnings: list[str] = []
    if skipped:
        why = ", ".join(f"{n:,} whose {reason}" for reason, n in sorted(skipped.items()))
        warnings.append(f"{sum(skipped.values()):,} trace events were left out ({why})")
    if bad_names:
        warnings.append(f"{bad_names:,} event names are not valid Unicode (lone surrogates): read with U+FFFD")
    if no_args:
        warnings.append(f"{no_args:,} trace events have args that are not an object: read without them")
    if api_df.is_empty():
        warnings.append("the trace has no cuda_runtime/cuda_driver events: kernels cannot be joined "
                        "to their launching calls")
    return sanity.checked(Trace(
        path=path, format="kineto-json", kernels=kern, memops=mem, api=api_df,
        nvtx=pl.DataFrame(nvtx, schema=list(NVTX_SCHEMA.items()), orient="row") if nvtx else empty(NVTX_SCHEMA),
        strings=strings.frame(), gpus=_gpus(doc), processes=_processes(processes, api_df),
        nsys_version=None, schema_version=_schema_version(doc), warnings=warnings,
    ))


def _host_pid(api: pl.DataFrame, nvtx: list[tuple], processes: dict[int, str]) -> int:
    if api.height:
        return int(api["pid"].mode().sort()[0])
    if nvtx:
        return int(nvtx[0][0])
    return next(iter(processes), 0)


def _launching_pid(acts: pl.DataFrame, api: pl.DataFrame, host_pid: int) -> pl.DataFrame:
    """Each GPU row takes the pid of its launching call (same correlation id)."""
    if acts.is_empty():
        return acts
    cols = acts.columns
    if api.height:
        owner = api.filter(pl.col("corr").is_not_null()).group_by("corr").agg(pl.col("pid").first().alias("_pid"))
        acts = acts.join(owner, on="corr", how="left")
    else:
        acts = acts.with_columns(pl.lit(None, pl.Int64).alias("_pid"))
    return acts.with_columns(pl.col("_pid").fill_null(host_pid).alias("pid")).select(cols)


def _gpus(doc: object) -> pl.DataFrame:
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    if not isinstance(props, list) or not props:
        return empty(GPU_SCHEMA)
    rows = []
    for p in props:
        if not isinstance(p, dict):
            continue
        name = p.get("name")
        rows.append((_int(p.get("id"), _I32), _text(name)[0] if isinstance(name, str) else None, _int(p.get("numSms")),
                     None, _int(p.get("totalGlobalMem"))))
    rows = [r for r in rows if r[0] is not None]
    if not rows:
        return empty(GPU_SCHEMA)
    return pl.DataFrame(rows, schema=list(GPU_SCHEMA.items()), orient="row").unique("device").sort("device")


def _processes(names: dict[int, str], api: pl.DataFrame) -> pl.DataFrame:
    pids = set(api["pid"].unique().to_list()) if api.height else set(names)
    rows = [(p, names[p]) for p in sorted(pids) if p in names]
    return pl.DataFrame(rows, schema=list(PROCESS_SCHEMA.items()), orient="row") if rows else empty(PROCESS_SCHEMA)


def _schema_version(doc: object) -> str | None:
    v = doc.get("schemaVersion") if isinstance(doc, dict) else None
    return None if v is None else f"kineto {_text(v)[0][:40]}"
