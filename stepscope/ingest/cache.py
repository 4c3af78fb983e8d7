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
  entry that fails is removed, so the next store writes it anew;
- meta.json holds the SHA-256 of every Parquet file, checked on each read (the bytes are read
  once, hashed and parsed from memory): a flipped bit or a rewritten frame is a miss and one
  warning, never an answer;
- an entry or cache folder that is a symlink, is owned by another user or is writable by group
  or others is not trusted (a miss and a warning; a symlinked folder is neither read nor written):
  in a shared folder another user could otherwise plant an answer;
- an empty -wal (SQLite makes one, with its -shm, to read a WAL-mode export) counts as none, so a
  WAL export is cached on its first read.

Kept small: `.tmp-*`/`.old-*` leftovers of a killed write older than an hour are removed, and
after each store the entries of that folder beyond `$STEPSCOPE_CACHE_MAX_BYTES` (default 4 GiB)
are removed, least recently used first.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

import polars as pl

from stepscope import model
from stepscope.model import Trace

FORMAT = 6  # 4: the key holds a content fingerprint; meta.json is checked field by field; 5: checksums;
# 6: names beyond sanity.NAME_MAX characters are stored shortened
STALE_S = 3600  # a .tmp-* folder older than this is a killed write's
MAX_BYTES = 4 << 30  # default budget of one cache folder ($STEPSCOPE_CACHE_MAX_BYTES)
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
        if suffix == "-wal" and st.st_size == 0 and stat.S_ISREG(st.st_mode):
            continue  # an empty WAL holds no page: made by the first reader of a WAL-mode export
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


def budget() -> int:
    """The bytes one cache folder may hold ($STEPSCOPE_CACHE_MAX_BYTES, default 4 GiB)."""
    try:
        return max(int(os.environ.get("STEPSCOPE_CACHE_MAX_BYTES", MAX_BYTES)), 0)
    except ValueError:
        return MAX_BYTES


def untrusted(d: Path) -> str | None:
    """Why a cache folder or entry `d` may not be trusted (None when it may): a symlink, another
    user's, or writable by group or others. lstat: a symlink is judged, not followed."""
    try:
        st = os.lstat(d)
    except OSError:
        return None  # absent: nothing to trust
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    if st.st_uid != os.getuid():
        return f"it is owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "it is writable by group or others"
    return None


def fresh_folder(root: Path, prefix: str = ".tmp-") -> Path | None:
    """A new folder (`prefix` and a random name: prune's name for a write in progress) in the
    cache folder `root`, made only where `root` is trusted before and after it is made (a symlink
    is never followed, another user's never written); None where not, or where making fails."""
    if untrusted(root) is not None:
        return None
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o755)
        if untrusted(root) is not None:  # made by another between the check and mkdir
            return None
        return Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    except OSError:
        return None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _meta_ok(m: object, key: str) -> bool:
    if not isinstance(m, dict) or m.get("cache_format") != FORMAT or m.get("key") != key:
        return False
    files = m.get("sha256")
    if not isinstance(files, dict) or set(files) != set(FRAMES) or not all(isinstance(v, str) for v in files.values()):
        return False
    for k, t in _META.items():
        v = m.get(k, ...)
        if v is ... or not isinstance(v, t) or (t is int and (isinstance(v, bool) or v < 0)):
            return False
    return m["format"] == "nsys-sqlite" and all(isinstance(w, str) for w in m["warnings"])


class _Mismatch(Exception):
    """A frame's bytes are not those its entry's meta.json names."""


def _read_entry(d: Path, key: str, launch_config: bool, events: bool = True) -> tuple[dict, dict] | None:
    """meta and frames of an entry, or None when any part is missing, unreadable or of another
    shape than this version's model; _Mismatch when a file's checksum is not its meta's."""
    try:
        m = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        if not _meta_ok(m, key):
            return None
        frames = {}
        for f in FRAMES if events else [f for f in FRAMES if f not in model.EVENT_FRAMES]:
            frames[f] = _frame_of(d, f, m["sha256"][f])
    except _Mismatch:
        raise
    except (Exception, pl.exceptions.PanicException):  # polars may panic on a damaged Parquet file
        return None
    for f, df in frames.items():
        if dict(df.schema) != _columns(f, launch_config):
            return None
    return m, frames


def load(path: Path, launch_config: bool, schema_version: str | None, fp: str | None = None,
         warnings: list[str] | None = None, events: bool = True) -> Trace | None:
    """The cached trace of `path` as it is now, or None. A damaged entry is removed; why an
    entry was not trusted is appended to `warnings` (one line each). `events=False`: the
    kernel, memop and API frames are left unread, as if let go with Trace.drop_event_frames
    (Trace.read_events reads them when the caller needs them)."""
    key = _key(path, launch_config, schema_version, fp)
    say = warnings.append if warnings is not None else (lambda w: None)
    for root in _roots(path):
        why = untrusted(root)
        if why is not None:
            say(f"cache folder {root} not used: {why}; the export was read instead")
            continue
        d = _entry(root, path, key)
        if not (d / "meta.json").exists():
            continue
        why = untrusted(d)
        if why is not None:
            say(f"cache entry {d} not used: {why}; the export was read instead")
            continue
        try:
            got = _read_entry(d, key, launch_config, events)
        except _Mismatch as e:
            say(f"cache entry {d} not used: {e}.parquet does not match its checksum (damaged or "
                "altered); the export was read instead and the entry written anew")
            got = None
        if got is None:
            shutil.rmtree(d, ignore_errors=True)  # never trusted; the store after the read rewrites it
            continue
        m, frames = got
        try:
            os.utime(d)  # its age is its last use: the size budget prunes the least recently used
        except OSError:
            pass
        unread = {f: model.empty(_columns(f, launch_config)) for f in model.EVENT_FRAMES if f not in frames}
        trace = Trace(path=path, **frames, **unread, **{k: m[k] for k in SCALARS}, cache_dir=d)
        if unread:
            trace.drop_event_frames(reread=True)
        return trace
    return None


def prune(root: Path, keep: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove from `root` the leftovers of killed writes older than STALE_S, then the entries
    beyond budget(), least recently used first (never `keep`). Returns what was removed."""
    now = time.time() if now is None else now
    removed, entries = [], []
    try:
        listing = list(os.scandir(root))
    except OSError:
        return removed
    for e in listing:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if e.name.startswith((".tmp-", ".old-")):
            if now - st.st_mtime > STALE_S:
                shutil.rmtree(e.path, ignore_errors=True)
                removed.append(Path(e.path))
        elif stat.S_ISDIR(st.st_mode) and Path(e.path) != keep:
            entries.append((st.st_mtime, _size(Path(e.path)), Path(e.path)))
    total = sum(s for _, s, _ in entries) + (_size(keep) if keep else 0)
    for _, size, d in sorted(entries):
        if total <= budget():
            break
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
        total -= size
    return removed


def _size(d: Path) -> int:
    """The bytes of an entry's files, its derived entries' (load_derived) included."""
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())


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
        tmp = fresh_folder(root)
        if tmp is None:
            continue
        try:
            sums = {f: _write_frame(tmp, f, getattr(trace, f), "lz4") for f in FRAMES}
            (tmp / "meta.json").write_text(json.dumps(meta | {"sha256": sums}), encoding="utf-8")
            final = _entry(root, path, key)
            if final.exists():  # an entry that load() could not remove, or a concurrent store
                old = Path(tempfile.mkdtemp(prefix=".old-", dir=root))
                os.replace(final, old / "entry")
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(final)
            prune(root, keep=final)
            return final
        except (OSError, pl.exceptions.PolarsError):
            shutil.rmtree(tmp, ignore_errors=True)
    return None


def frameless_entry(path: Path, kind: str) -> Path | None:
    """An entry of `path` as it is now that holds no frames, only the derived entries an analysis
    keeps in it (store_derived): a long run analyzed by windows (by_windows.py), whose frames are
    never held whole and never cached. Keyed like a frames entry (path, inode, size, time, content
    fingerprint), with `kind` in place of the grid/block flag, so that no frames entry is ever it;
    trusted, used and pruned like one. None when no cache folder is writable."""
    key = _key(path, kind, None)
    for root in _roots(path):
        if untrusted(root) is not None:
            continue
        d = _entry(root, path, key)
        if (d / "meta.json").is_file():
            if untrusted(d) is not None:
                continue
            try:
                os.utime(d)
            except OSError:
                pass
            return d
        tmp = fresh_folder(root)
        if tmp is None:
            continue
        try:
            (tmp / "meta.json").write_text(json.dumps({"cache_format": FORMAT, "key": key, "kind": kind}),
                                           encoding="utf-8")
            tmp.rename(d)
            prune(root, keep=d)
            return d
        except OSError:
            continue
    return None


# --- derived entries ---------------------------------------------------------------------------
# An analysis of an entry's frames may keep frames of its own inside that entry, under a key it
# computes (the options and code the result depends on): removed with the entry, pruned with it,
# and checked like it (trusted folder, meta.json field by field, a SHA-256 per file). One per
# `name`: storing another replaces it. Written uncompressed: read back it costs a third of LZ4's
# time on a million rows, and it is a second read of the same export.

DERIVED_FORMAT = 1


def _derived(entry: Path, name: str, key: str) -> Path:
    return entry / f"{name}-{key}"


def load_derived(entry: Path | None, name: str, key: str, lazy: tuple[str, ...] = ()
                 ) -> tuple[dict[str, pl.DataFrame], dict] | None:
    """(frames, extra) that store_derived() kept in `entry` under `name` and `key`, or None (a
    damaged or untrusted one is removed or ignored; a miss either way). The frames named in
    `lazy` are not read: each is a function that reads it (checksum checked then; InputError when
    the entry changed meanwhile), for a caller that may never ask for it."""
    if entry is None or untrusted(entry) is not None:
        return None
    d = _derived(entry, name, key)
    if not (d / "meta.json").exists() or untrusted(d) is not None:
        return None
    try:
        m = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        ok = (isinstance(m, dict) and m.get("derived_format") == DERIVED_FORMAT and m.get("key") == key
              and isinstance(m.get("sha256"), dict) and isinstance(m.get("extra"), dict)
              and all(isinstance(k, str) and isinstance(v, str) for k, v in m["sha256"].items()))
        frames = {}
        for f, digest in (m["sha256"].items() if ok else ()):
            if f in lazy:
                ok = (d / f"{f}.parquet").is_file()
                frames[f] = _reader(d, f, digest)
            else:
                frames[f] = _frame_of(d, f, digest)
            if not ok:
                break
    except (Exception, pl.exceptions.PanicException):
        ok = False
    if not ok:
        shutil.rmtree(d, ignore_errors=True)
        return None
    return frames, m["extra"]


def _write_frame(d: Path, f: str, df: pl.DataFrame, compression: str) -> str:
    """Write `df` as d/<f>.parquet; its SHA-256, for meta.json (_frame_of checks it on the read)."""
    buf = io.BytesIO()
    df.write_parquet(buf, compression=compression)
    data = buf.getvalue()
    (d / f"{f}.parquet").write_bytes(data)
    return _digest(data)


def _frame_of(d: Path, f: str, digest: str) -> pl.DataFrame:
    data = (d / f"{f}.parquet").read_bytes()  # read once: hashed, then parsed from memory
    if _digest(data) != digest:
        raise _Mismatch(f)
    return pl.read_parquet(data)


def _reader(d: Path, f: str, digest: str):
    def read() -> pl.DataFrame:
        try:
            return _frame_of(d, f, digest)
        except (Exception, pl.exceptions.PanicException):
            shutil.rmtree(d, ignore_errors=True)
            from stepscope.errors import InputError

            raise InputError(f"cache entry {d} changed while it was in use: run the command again (or with "
                             "--no-cache)") from None
    return read


def store_derived(entry: Path | None, name: str, key: str, frames: dict[str, pl.DataFrame],
                  extra: dict) -> Path | None:
    """Keep `frames` (names: identifiers) and `extra` (JSON) in `entry` under `name` and `key`,
    atomically, replacing any other of that name; None when it cannot be written."""
    if entry is None or untrusted(entry) is not None or not entry.is_dir():
        return None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry))
    except OSError:
        return None
    try:
        sums = {f: _write_frame(tmp, f, df, "uncompressed") for f, df in frames.items()}
        meta = {"derived_format": DERIVED_FORMAT, "key": key, "sha256": sums, "extra": extra}
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        for old in entry.glob(f"{name}-*"):
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
        final = _derived(entry, name, key)
        tmp.rename(final)
        return final
    except (OSError, pl.exceptions.PolarsError, TypeError, ValueError):
        shutil.rmtree(tmp, ignore_errors=True)
        return None
