"""An export's event rows kept on local disk for the windows of one analysis: each chunk of a
table as SQLite returned it (before typed.clean), one Arrow IPC file per chunk, read back when a
window needs it.

Why: reading a long run by windows from SQLite costs two passes over its tables, the chunk map's
aggregates at open and then each window's chunks, and the windows overlap by their context: at 5M
kernels that was 12 s of reading against the whole read's 5 s (docs/PERFORMANCE.md, "A long run in
bounded memory"). With the rows spilled as they are read once at open, the map is made from them
and a window's chunks come back from a file at memory speed. Polars writes and reads the files
(Arrow IPC, uncompressed: a chunk of 65,536 kernels is ~5 MB, written in a few milliseconds); a
long run's spill is about the size of its export's event tables, and is removed when the reader
closes.

The folder is made where the export's cache would be (ingest/cache.py: `.stepscope-cache/` beside
the export, else `$STEPSCOPE_CACHE_DIR`, each trusted as the cache trusts it), on the export's own
disk rather than a /tmp that may be a RAM disk; where none can be made, or a write fails (a full
disk), there is no spill and windows read SQLite as before (`None`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

PREFIX = ".tmp-spill-"  # cache.prune's name for a write in progress (removed when an hour old)


class Spill:
    """Chunks by (table, first rowid): put once, got as often as windows need them."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._files: dict[tuple[str, int], tuple[Path, bool]] = {}

    @classmethod
    def beside(cls, export: Path) -> "Spill | None":
        """A spill in a fresh folder under the export's cache roots, or None where none can be made.
        The roots are trusted as the cache trusts them (a symlinked, another user's or a group-
        writable folder is never written); the folder is named as the cache's own unfinished
        writes are (`.tmp-`), so that the cache's prune neither counts it as an entry nor keeps
        it past an hour when a killed run left it."""
        from stepscope.ingest.cache import _roots, fresh_folder

        for root in _roots(export):
            folder = fresh_folder(root, PREFIX)
            if folder is not None:
                return cls(folder)
        return None

    def put(self, table: str, a: int, raw: pl.DataFrame, is_typed: bool) -> None:
        """Keep chunk `a` of `table`: its raw frame (columns named, as typed.clean names them)
        and whether it was read typed. OSError (a full disk) is the caller's to handle."""
        f = self.folder / f"{table}-{a}.arrow"  # one name per key: threads put chunks at once
        raw.write_ipc(f, compression="uncompressed")
        self._files[(table, a)] = (f, is_typed)

    def get(self, table: str, a: int) -> tuple[pl.DataFrame, bool]:
        f, is_typed = self._files[(table, a)]
        return pl.read_ipc(f), is_typed

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self._files.clear()
