"""The one compiled part: stepscope.ingest._scan, the SQLite reader of the big integer tables
(stepscope/ingest/_scan.c). optional=True: without a C compiler or SQLite's header the build
goes on without it, and the reader uses ADBC for every table (the same frames, more slowly).
Everything else about the package is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("stepscope.ingest._scan", ["stepscope/ingest/_scan.c"], libraries=["sqlite3"],
                             optional=True)])
