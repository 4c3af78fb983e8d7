"""Shared fixtures: the real traces (project fixtures/ and ../shared/external/)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
EXTERNAL = ROOT.parent / "shared" / "external"
EXTERNAL_FILES = sorted(EXTERNAL.glob("*.sqlite"))


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(params=EXTERNAL_FILES, ids=[p.name for p in EXTERNAL_FILES])
def external(request) -> Path:
    return request.param
