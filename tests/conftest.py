"""Shared fixtures: the real traces (project fixtures/ and the foreign exports).

The foreign exports (other projects' nsys exports, see fixtures/README.md) are not in the
repository: they are read from ../shared/external beside the checkout, or from
$STEPSCOPE_EXTERNAL. Every test that needs one skips, naming the file, when it is absent, so a
bare clone passes; `STEPSCOPE_EXTERNAL=/nonexistent python -m pytest` shows that pass here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import sys
import types
from pathlib import Path

# The suite's own processes (xdist runs one worker per core, and the command-line tests start
# more): one polars thread each, since on the small fixtures a thread pool per process adds only
# wake-ups (about 9 % of the CPU of the analysis tests on the 2-core box); and compiled modules
# kept, even where the environment says PYTHONDONTWRITEBYTECODE (this box does), so that each
# worker and child process does not compile stepscope and rewrite the tests' asserts again
# (__pycache__/ is git-ignored). Set before anything here imports polars or stepscope.
os.environ.setdefault("POLARS_MAX_THREADS", "1")
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest
from hypothesis import HealthCheck, settings
from typer.testing import CliRunner as _TyperRunner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
EXTERNAL = Path(os.environ.get("STEPSCOPE_EXTERNAL") or ROOT.parent / "shared" / "external")
EXTERNAL_FILES = sorted(EXTERNAL.glob("*.sqlite"))
# the what-if reads the user's calibration file when there is one (whatif.default_calibration):
# the suite's figures are the bundled calibration's, whatever the machine's config holds
os.environ["XDG_CONFIG_HOME"] = str(ROOT / "tests" / "no-user-config")


# ---------------------------------------------------------------- property tests (hypothesis)
# A developer's run (and .ci/run's first pass) draws few examples a property; .ci/run's second
# pass runs every property test again with HYPOTHESIS_PROFILE=stepscope-ci, the full setting (the
# same examples every run); stepscope-explore draws many fresh ones. `examples(full, quick)` is a
# test's example count under the chosen profile.
_HC = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("stepscope-quick", max_examples=10, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_HC)
settings.register_profile("stepscope-ci", max_examples=30, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_HC)
settings.register_profile("stepscope-explore", max_examples=500, deadline=None, database=None,
                          suppress_health_check=_HC)
_CHOSEN = os.environ.get("HYPOTHESIS_PROFILE", "")
PROFILE_NAME = _CHOSEN if _CHOSEN.startswith("stepscope-") else "stepscope-quick"
PROFILE = settings.get_profile(PROFILE_NAME)


def examples(full: int, quick: int) -> settings:
    """A property's settings: `full` examples under stepscope-ci, `quick` by default (a property
    slow per example: each runs commands on a whole export), many under stepscope-explore."""
    n = {"stepscope-quick": quick, "stepscope-ci": full}.get(PROFILE_NAME, PROFILE.max_examples)
    return settings(PROFILE, max_examples=n)


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def eager_copy(tmp_path: Path) -> Path:
    """A copy of the bundled eager decode step in tmp_path, for a test that damages or guards it."""
    p = tmp_path / "t.sqlite"
    shutil.copy(need(FIXTURES / "llama8b_decode_b1_eager.sqlite"), p)
    return p


def one_line_2(r, *needles) -> None:
    """A CLI result that failed as bad input: exit 2, one line, no traceback, naming `needles`."""
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in r.output, r.output


def copy_with(folder: Path, source: Path, ops, apply, skip=(sqlite3.Error,)) -> Path:
    """A copy of `source` in `folder` with `apply(con, op)` run for each of `ops`, each committed
    on its own; an op the file cannot take (one of `skip`: a table an earlier op dropped, a
    constraint) is rolled back and the next one runs. The property tests' damaged exports."""
    p = folder / source.name
    shutil.copy(source, p)
    con = sqlite3.connect(p)
    for op in ops:
        try:
            apply(con, op)
            con.commit()
        except skip:
            con.rollback()
    con.close()
    return p


def cache_export(tmp_path: Path, monkeypatch) -> Path:
    """A copy of the eager step in tmp_path, cached by stepscope even at its 420 kernels, with a
    cache folder of its own for the user's (the cache tests' export)."""
    from stepscope.ingest import cache

    monkeypatch.setattr(cache, "MIN_KERNELS", 100)  # the fixture has 420 kernels
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(tmp_path / "home-cache"))
    p = tmp_path / "trace.sqlite"
    shutil.copy(need(FIXTURES / "llama8b_decode_b1_eager.sqlite"), p)
    return p


def mutated(tmp_path: Path, *sql: str, source: Path = FIXTURES / "llama8b_decode_b1_eager.sqlite") -> Path:
    """A copy of the export `source` in tmp_path with the statements `sql` applied to it (the
    fixture itself is never touched)."""
    p = tmp_path / "m.sqlite"
    shutil.copy(need(source), p)
    con = sqlite3.connect(p)
    for s in sql:
        con.execute(s)
    con.commit()
    con.close()
    return p


# tests import this module both as `conftest` (pytest's name for it) and as `tests.conftest`: the
# caches below are one set for both copies (per test process: each xdist worker has its own)
_SHARED = sys.modules.setdefault("stepscope_tests_shared", types.ModuleType("stepscope_tests_shared"))
if not hasattr(_SHARED, "gunzipped"):
    _SHARED.gunzipped, _SHARED.diagnoses = {}, {}
_GUNZIPPED: dict[Path, Path] = _SHARED.gunzipped


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


def serving_export(mode: str) -> Path:
    """The 48-request vLLM serving run (graph or eager), unpacked."""
    return gunzipped(SERVING / f"llama-3.1-8b_serve_r48_s0_{mode}.sqlite.gz")


def serving_diagnosis(mode: str):
    """diagnose(load(serving_export(mode), cache=False)), computed once per test process for the
    modules that read it (its frames are polars frames: no test can change them in place)."""
    if mode not in _SHARED.diagnoses:
        from stepscope import library
        from stepscope.analysis.diagnosis import diagnose

        _SHARED.diagnoses[mode] = diagnose(library.load(serving_export(mode), None, None, cache=False))
    return _SHARED.diagnoses[mode]


TRACE_FRAMES = ("kernels", "api", "memops", "nvtx", "strings", "gpus", "processes", "threads")


def same_trace(a, b) -> None:
    """Two reads of one export: the same frames (dtypes included) and the same warnings."""
    for f in TRACE_FRAMES:
        x, y = getattr(a, f), getattr(b, f)
        assert x.schema == y.schema, f
        assert x.equals(y), f
    assert a.warnings == b.warnings


def ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(params=EXTERNAL_FILES, ids=[p.name for p in EXTERNAL_FILES])
def external(request) -> Path:
    return request.param


def _built_once():
    """typer builds the click command from the app's functions on every call of the app or of
    CliRunner.invoke (~0.1 s for stepscope's commands); a real process builds it once. Built
    once per test process here too, for the same app object (a suite of over a thousand
    in-process command lines); the command it builds is the same each time."""
    import typer.main
    import typer.testing

    if getattr(typer.main.get_command, "stepscope_once", False):
        return  # this conftest imported under its second name
    build, built = typer.main.get_command, {}

    def get_command(typer_instance):
        hit = built.get(id(typer_instance))
        if hit is None or hit[0] is not typer_instance:
            hit = built[id(typer_instance)] = (typer_instance, build(typer_instance))
        return hit[1]

    get_command.stepscope_once = True
    typer.main.get_command = typer.testing._get_command = get_command


_built_once()


# ---------------------------------------------------------------- committed exports read once a process
# Over a thousand tests read the same few dozen committed exports (the bundled eager step alone
# ~280 times a run), each read 30-50 ms of a small analysis' 250: the format reading
# (ingest._read_trace) of a file under fixtures/ or the foreign exports, unchanged since, is done
# once per test process and handed out as a copy. read_trace still reads the sidecar and sets
# the reread each time. A test that patches anything (it asks for `monkeypatch`: another reader,
# a forced fallback, a counted read) reads for itself, as does every read of a file the test
# made, so what a test of the reader sees is the reader's own work (one that patches by hand
# reads inside reads_for_itself()).
_READ_ONCE: dict = _SHARED.__dict__.setdefault("read_once", {"on": False})  # one for both module names


def _committed(path) -> Path | None:
    try:
        p = Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    roots = (FIXTURES.resolve(), EXTERNAL.resolve())
    if any(p.is_relative_to(r) for r in roots) or p in _GUNZIPPED.values():
        return p
    return None


def _read_once():
    import copy

    from stepscope import ingest

    if getattr(ingest._read_trace, "stepscope_once", False):
        return  # this conftest imported under its second name
    real, memo = ingest._read_trace, {}

    def _read_trace(path, launch_config=True, cache=None, events=True):
        p = _committed(path) if _READ_ONCE["on"] else None
        st = p.stat() if p is not None and p.is_file() else None
        if st is None:
            return real(path, launch_config, cache, events)
        env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("STEPSCOPE_", "POLARS_"))))
        key = (str(p), st.st_ino, st.st_size, st.st_mtime_ns, launch_config, cache, events, env)
        if key not in memo:
            memo[key] = real(path, launch_config, cache, events)
        kept = memo[key]
        trace = object.__new__(type(kept))  # frames are shared (polars frames are values), the rest copied
        trace.__dict__.update(kept.__dict__)
        trace.warnings = list(kept.warnings)
        trace.sidecar = copy.deepcopy(kept.sidecar)
        return trace

    _read_trace.stepscope_once = True
    ingest._read_trace = _read_trace


_read_once()


@contextlib.contextmanager
def reads_for_itself():
    """For a test that patches the reader by hand (not through `monkeypatch`): every read inside
    is the reader's own."""
    was, _READ_ONCE["on"] = _READ_ONCE["on"], False
    try:
        yield
    finally:
        _READ_ONCE["on"] = was


@pytest.fixture(autouse=True)
def _reads_shared_unless_patched(request):
    _READ_ONCE["on"] = "monkeypatch" not in request.fixturenames
    yield
    _READ_ONCE["on"] = False


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


# ---------------------------------------------------------------- what .ci/run's later passes select
# .ci/run runs the whole suite once, then again only the tests that depend on what each later
# pass varies (a bare clone without the foreign exports, the oldest polars pyproject allows, the
# sqlite3 fallback without ADBC). The marks are given here, by module, so a new test in one of
# these modules is selected without anyone remembering to mark it.

# the modules whose tests read the SQLite exports through the reader (ADBC when installed, else
# the sqlite3 fallback): their figures must not depend on which path read them
ADBC_MODULES = {
    "test_ingest", "test_golden_json", "test_sqlite_damage", "test_impossible_values", "test_cache_freshness",
    "test_cache", "test_memory_policy", "test_library", "test_steps_without_names", "test_bytes_budget", "test_bytes_real",
    "test_inventory_fixtures", "test_vllm_fixtures", "test_collectives", "test_export_perfetto", "test_sqlite_reader",
    "test_mutated_captures", "test_window_reader",
}
# the modules that touch no polars data path (capture's process handling, the torch engine's own
# step, the docs, the import graph, native allocator settings, path refusals): every other
# module runs again under the oldest polars
POLARS_FREE_MODULES = {
    "test_capture_torch_engine", "test_capture_commands", "test_capture_nsys", "test_capture_models",
    "test_docs", "test_layering", "test_native", "test_bench_rss", "test_paths",
}
# the modules whose tests share what a module fixture or cache computed once (a serving run's
# diagnosis, eight reports written, the what-if pairs compared): under xdist (-n) each group runs
# on one worker, so that work is done once, not once per worker; every other test goes to
# whichever worker is free, as under xdist's default `--dist load`
XDIST_GROUPS = {
    "test_serving_run": "serving", "test_compare_runs": "serving", "test_many_reports": "many_reports",
    "test_whatif": "whatif", "test_steps_without_ranges": "steps_without_ranges", "test_known_step": "known_step",
    "test_selection_serving": "selection_serving", "test_columnar": "columnar", "test_vllm_fixtures": "vllm_fixtures",
    "test_classes_models": "classes_models", "test_mutated_captures": "mutated_captures",
}


def pytest_xdist_make_scheduler(config, log):
    """xdist's `load` (what -n picks when no --dist is given) with XDIST_GROUPS kept together."""
    if config.getvalue("dist") != "load":
        return None  # an explicit other --dist
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
            return XDIST_GROUPS.get(module, nodeid)

    return Grouped(config, log)


_EXTERNAL_TEXT: dict[str, bool] = {}


def _reads_external(item) -> bool:
    """A test of a module that names the foreign exports (EXTERNAL, the `external` fixture)."""
    path = str(item.fspath)
    if path not in _EXTERNAL_TEXT:
        text = Path(path).read_text(encoding="utf-8")
        _EXTERNAL_TEXT[path] = "EXTERNAL" in text or "external" in text
    return "external" in item.fixturenames or _EXTERNAL_TEXT[path]


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = Path(str(item.fspath)).stem
        if _reads_external(item):
            item.add_marker(pytest.mark.external)
        if module in ADBC_MODULES:
            item.add_marker(pytest.mark.adbc)
        if module not in POLARS_FREE_MODULES:
            item.add_marker(pytest.mark.polars_compat)
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
