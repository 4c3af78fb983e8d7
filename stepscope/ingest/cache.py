"""Parquet cache of a big export's normalized frames, so its second analysis skips SQLite.

Keyed by the export's resolved path, size, modification time and schema version (and the
cache format and whether grid/block were read), kept in `.stepscope-cache/` beside the export,
or under `$STEPSCOPE_CACHE_DIR` (default `~/.cache/stepscope/traces`) when that folder is not
writable. Nothing is ever written into the export itself. Small exports are not cached: reading
them is already faster than the Parquet round trip is worth.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import polars as pl

from stepscope import model
from stepscope.model import Trace

# the model's dtypes per frame: an entry whose frames differ (written by another version) is
# ignored, so a cache can never hand an analysis frames of the wrong types
_SCHEMAS = {"kernels": model.KERNEL_SCHEMA, "memops": model.MEMOP_SCHEMA, "api": model.API_SCHEMA,
            "nvtx": model.NVTX_SCHEMA, "strings": model.STRING_SCHEMA, "gpus": model.GPU_SCHEMA,
            "processes": model.PROCESS_SCHEMA, "threads": model.THREAD_SCHEMA}


def _current(frames: dict[str, pl.DataFrame]) -> bool:
    return all(frames[f].schema.get(c, t) == t for f, schema in _SCHEMAS.items() for c, t in schema.items())

FORMAT = 3  # 3: ids and OS numbers are Int32 in the model
MIN_KERNELS = 50_000
FRAMES = ("kernels", "memops", "api", "nvtx", "strings", "gpus", "processes", "threads")
SCALARS = ("format", "nsys_version", "schema_version", "graph_level_launches", "profiler_overhead_count",
           "profiler_overhead_ns", "warnings")


def enabled() -> bool:
    return not os.environ.get("STEPSCOPE_NO_CACHE")


def _key(path: Path, launch_config: bool, schema_version: str | None) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{schema_version}|{FORMAT}|{launch_config}"
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def _roots(path: Path) -> list[Path]:
    home = Path(os.environ.get("STEPSCOPE_CACHE_DIR", Path.home() / ".cache" / "stepscope" / "traces"))
    return [path.resolve().parent / ".stepscope-cache", home]


def _entry(root: Path, path: Path, key: str) -> Path:
    return root / f"{path.stem}-{key}"


def load(path: Path, launch_config: bool, schema_version: str | None) -> Trace | None:
    key = _key(path, launch_config, schema_version)
    for root in _roots(path):
        d = _entry(root, path, key)
        meta = d / "meta.json"
        if meta.is_file():
            try:
                m = json.loads(meta.read_text())
                frames = {f: pl.read_parquet(d / f"{f}.parquet") for f in FRAMES}
            except (OSError, ValueError, pl.exceptions.PolarsError):
                continue  # a damaged entry is ignored, never trusted
            if not _current(frames):
                continue
            return Trace(path=path, **frames, **{k: m[k] for k in SCALARS})
    return None


def store(trace: Trace, path: Path, launch_config: bool) -> Path | None:
    """Write the entry atomically (temp folder, then rename); None when no location is writable."""
    if trace.kernels.height < MIN_KERNELS:
        return None
    key = _key(path, launch_config, trace.schema_version)
    for root in _roots(path):
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        except OSError:
            continue
        try:
            for f in FRAMES:
                getattr(trace, f).write_parquet(tmp / f"{f}.parquet", compression="lz4")
            (tmp / "meta.json").write_text(json.dumps({k: getattr(trace, k) for k in SCALARS}))
            final = _entry(root, path, key)
            if final.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.rename(final)
            return final
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return None
