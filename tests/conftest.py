"""Shared fixtures: the real traces (project fixtures/ and the foreign exports).

The foreign exports (other projects' nsys exports, see fixtures/README.md) are not in the
repository: they are read from ../shared/external beside the checkout, or from
$STEPSCOPE_EXTERNAL. Every test that needs one skips, naming the file, when it is absent, so a
bare clone passes; `STEPSCOPE_EXTERNAL=/nonexistent python -m pytest` shows that pass here.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner as _TyperRunner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
EXTERNAL = Path(os.environ.get("STEPSCOPE_EXTERNAL") or ROOT.parent / "shared" / "external")
EXTERNAL_FILES = sorted(EXTERNAL.glob("*.sqlite"))


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


_GUNZIPPED: dict[Path, Path] = {}


def gunzipped(path: Path) -> Path:
    """A gzip'd fixture export (`x.sqlite.gz`) unpacked once per test session into a temporary
    folder, with its sidecar (`x.stepscope.json`) and engine log copied beside it; the
    fixture itself is never touched. Large exports are committed gzip'd so that the checkout
    stays small."""
    import gzip
    import shutil
    import tempfile

    path = Path(path)
    if path in _GUNZIPPED and _GUNZIPPED[path].exists():
        return _GUNZIPPED[path]
    folder = Path(tempfile.mkdtemp(prefix="stepscope-fixture-"))
    out = folder / path.name[: -len(".gz")]
    with gzip.open(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    stem = out.name[: -len(".sqlite")] if out.name.endswith(".sqlite") else out.stem
    for extra in (".stepscope.json", ".engine.log"):
        side = path.parent / (stem + extra)
        if side.exists():
            shutil.copy(side, folder / side.name)
    _GUNZIPPED[path] = out
    return out


SERVING = FIXTURES / "serving"


def ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(params=EXTERNAL_FILES, ids=[p.name for p in EXTERNAL_FILES])
def external(request) -> Path:
    return request.param


class _Boundary:
    """What CliRunner.invoke runs in place of `app`'s click command: the command line through
    stepscope.cli.run, main()'s one error boundary, so a test sees what the shell sees (bad input
    one line on stderr and its exit code, a usage error one line, a bug one line and exit 3)."""

    name = "stepscope"

    def __init__(self, app):
        self.app = app

    def main(self, args=(), prog_name=None, **extra):
        from stepscope.cli import run

        sys.exit(run(list(args), prog_name=prog_name, app=self.app))


class CliRunner(_TyperRunner):
    """typer's CliRunner, invoking `app` through stepscope.cli.run (see _Boundary)."""

    def invoke(self, app, args=None, **kwargs):
        from typer import testing

        real = testing._get_command
        testing._get_command = _Boundary
        try:
            return super().invoke(app, args, **kwargs)
        finally:
            testing._get_command = real
