"""Parquet cache of a big export's normalized frames, so its second analysis skips SQLite.

Kept in `.stepscope-cache/` beside the export, or under `$STEPSCOPE_CACHE_DIR` (default
`~/.cache/stepscope/traces`) when that folder is not writable. Nothing is ever written into the
export itself. Small exports are not cached: reading them is already faster than the Parquet
round trip is worth.

An entry must never answer for another file, or for this file as it was before a write:
- its key holds the export's resolved path, inode, size, modification time, schema version,
  the cache format, whether grid/block were read, and a content fingerprint (`fingerprint`):
  the SQLite header (whose file change counter moves on every write transaction) and a
  sample of its pages, plus the size, time and head of a -wal or -journal beside it (writes in
  WAL mode reach the main file only at a checkpoint). A copy that kept the old mtime (cp -p,
  rsync -t, an editor) still misses;
- the fingerprint is taken again after the read, and nothing is stored when the file changed
  during it;
- meta.json and every frame are checked before use (keys and types; columns and dtypes): an
  entry that fails is removed, so the next store writes it anew.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import polars as pl

from stepscope import model
from stepscope.model import Trace

FORMAT = 4  # 4: the key holds a content fingerprint; meta.json is checked field by field
MIN_KERNELS = 50_000
FRAMES = ("kernels", "memops", "api", "nvtx", "strings", "gpus", "processes", "threads")
SCALARS = ("format", "nsys_version", "schema_version", "graph_level_launches", "profiler_overhead_count",
           "profiler_overhead_ns", "warnings")
SAMPLE_PAGES = 64  # besides the first and the last: ~256 KiB read on a 4 KiB-page export

_SCHEMAS = {"kernels": model.KERNEL_SCHEMA, "memops": model.MEMOP_SCHEMA, "api": model.API_SCHEMA,
            "nvtx": model.NVTX_SCHEMA, "strings": model.STRING_SCHEMA, "gpus": model.GPU_SCHEMA,
            "processes": model.PROCESS_SCHEMA, "threads": model.THREAD_SCHEMA}
_DIMS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
# meta.json: each scalar's type (a type, or a tuple of allowed types)
_META = {"format": str, "nsys_version": (str, type(None)), "schema_version": (str, type(None)),
         "graph_level_launches": int, "profiler_overhead_count": int, "profiler_overhead_ns": int,
         "warnings": list}


def enabled() -> bool:
    return not os.environ.get("STEPSCOPE_NO_CACHE")


def fingerprint(path: Path) -> str:
    """What the content of an export looks like now, cheaply: its 100-byte header (file
    change counter included), a sample of its pages, and its -wal/-journal files' size, time
    and first and last bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        head = f.read(100)
        h.update(head)
        if len(head) == 100 and head.startswith(b"SQLite format 3\x00"):
            page = int.from_bytes(head[16:18], "big")
            page = 65536 if page == 1 else max(page, 512)
            pages = os.fstat(f.fileno()).st_size // page
            for i in sorted({0, max(pages - 1, 0), *(pages * k // SAMPLE_PAGES for k in range(SAMPLE_PAGES))}):
                f.seek(i * page)
                h.update(f.read(page))
    for suffix in ("-wal", "-journal"):
        side = path.with_name(path.name + suffix)
        try:
            st = side.stat()
        except OSError:
            continue
        h.update(f"{suffix}|{st.st_size}|{st.st_mtime_ns}".encode())
        if stat.S_ISREG(st.st_mode):  # a FIFO of that name would block the open
            with open(side, "rb") as f:
                h.update(f.read(32))  # a WAL header: its checkpoint sequence and salts
                f.seek(max(st.st_size - 4096, 0))
                h.update(f.read(4096))
    return h.hexdigest()[:32]


def _key(path: Path, launch_config: bool, schema_version: str | None, fp: str | None = None) -> str:
    st = path.stat()
    fp = fp or fingerprint(path)
    raw = (f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{fp}|{schema_version}|{FORMAT}|"
           f"{launch_config}")
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def _roots(path: Path) -> list[Path]:
    home = Path(os.environ.get("STEPSCOPE_CACHE_DIR", Path.home() / ".cache" / "stepscope" / "traces"))
    return [path.resolve().parent / ".stepscope-cache", home]


def _entry(root: Path, path: Path, key: str) -> Path:
    return root / f"{path.stem[:80]}-{key}"  # the stem cut: a long export name plus the key stays a valid name


def _columns(frame: str, launch_config: bool) -> dict:
    schema = _SCHEMAS[frame]
    if frame == "kernels" and not launch_config:
        return {c: t for c, t in schema.items() if c not in _DIMS}
    return schema


def _meta_ok(m: object, key: str) -> bool:
    if not isinstance(m, dict) or m.get("cache_format") != FORMAT or m.get("key") != key:
        return False
    for k, t in _META.items():
        v = m.get(k, ...)
        if v is ... or not isinstance(v, t) or (t is int and (isinstance(v, bool) or v < 0)):
            return False
    return m["format"] == "nsys-sqlite" and all(isinstance(w, str) for w in m["warnings"])


def _read_entry(d: Path, key: str, launch_config: bool) -> tuple[dict, dict] | None:
    """meta and frames of an entry, or None when any part is missing, unreadable or of another
    shape than this version's model."""
    try:
        m = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        if not _meta_ok(m, key):
            return None
        frames = {f: pl.read_parquet(d / f"{f}.parquet") for f in FRAMES}
    except (Exception, pl.exceptions.PanicException):  # polars may panic on a damaged Parquet file
        return None
    for f, df in frames.items():
        if dict(df.schema) != _columns(f, launch_config):
            return None
    return m, frames


def load(path: Path, launch_config: bool, schema_version: str | None, fp: str | None = None) -> Trace | None:
    """The cached trace of `path` as it is now, or None. A damaged entry is removed."""
    key = _key(path, launch_config, schema_version, fp)
    for root in _roots(path):
        d = _entry(root, path, key)
        if not (d / "meta.json").exists():
            continue
        got = _read_entry(d, key, launch_config)
        if got is None:
            shutil.rmtree(d, ignore_errors=True)  # never trusted; the store after the read rewrites it
            continue
        m, frames = got
        return Trace(path=path, **frames, **{k: m[k] for k in SCALARS})
    return None


def store(trace: Trace, path: Path, launch_config: bool, fp: str | None = None) -> Path | None:
    """Write the entry atomically (temp folder, then rename); None when no location is
    writable, or when the export changed since `fp` was taken before reading it."""
    if trace.kernels.height < MIN_KERNELS:
        return None
    now = fingerprint(path)
    if fp is not None and now != fp:
        return None  # written to while it was read: these frames may be of neither version
    key = _key(path, launch_config, trace.schema_version, now)
    meta = {k: getattr(trace, k) for k in SCALARS} | {"cache_format": FORMAT, "key": key}
    for root in _roots(path):
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        except OSError:
            continue
        try:
            for f in FRAMES:
                getattr(trace, f).write_parquet(tmp / f"{f}.parquet", compression="lz4")
            (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
            final = _entry(root, path, key)
            if final.exists():  # an entry that load() could not remove, or a concurrent store
                old = Path(tempfile.mkdtemp(prefix=".old-", dir=root))
                os.replace(final, old / "entry")
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(final)
            return final
        except (OSError, pl.exceptions.PolarsError):
            shutil.rmtree(tmp, ignore_errors=True)
    return None
