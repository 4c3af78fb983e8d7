"""Where the per-report work runs: one after another, or on dask.distributed.

- one report, or dask not installed: in this process, one report after another (the same
  function, so the same result; without dask a notice says how to get it)
- several reports: a dask LocalCluster sized to the machine (one worker per report up to the
  cores and the memory; one thread each, so a worker holds one report at a time and its memory
  is bounded by one report's analysis; polars in each worker gets its share of the cores)
- `scheduler`: an existing cluster (`tcp://host:8786`); its workers read the reports from the
  paths given, so those must be on storage every worker sees; only the small result frames of
  stepscope/reports.py travel back

Never a hang: a report that fails stops the run with one line naming it (the other reports'
tasks are cancelled); a worker that dies while analyzing a report fails that report at once
(the local cluster allows no retry; an existing cluster's own `allowed-failures` applies); a run
in which no report finishes for `timeout_s` (STEPSCOPE_REPORT_TIMEOUT_S, default 3600 s) stops
naming the reports still running; a cluster without a worker for WORKERLESS_S stops too.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from stepscope import scheduler_address
from stepscope.errors import StepscopeError
from stepscope.paths import shown
from stepscope.render import progress
from stepscope.reports import ReportFailure, ReportResult

DEFAULT_TIMEOUT_S = 3600.0
WORKERLESS_S = 60.0
CONNECT_TIMEOUT_S = 20.0
POLL_S = 0.5
# a worker's memory per report: one rank's 1M-kernel export (0.31 GB of SQLite) peaks at 0.53 GB
# analyzed alone (benchmarks/many_reports.py, docs/MANY_REPORTS.md): 4× the file leaves room,
# and a worker must hold the largest report
MEMORY_PER_REPORT_FACTOR = 4
MEMORY_PER_REPORT_MIN = 1 << 30


class ReportError(StepscopeError):
    """A report of the run could not be analyzed: the message names it."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def have_dask() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def timeout_s() -> float:
    raw = os.environ.get("STEPSCOPE_REPORT_TIMEOUT_S")
    try:
        t = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        t = DEFAULT_TIMEOUT_S
    return t if t > 0 else DEFAULT_TIMEOUT_S


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def local_workers(paths: list[Path], requested: int | None = None) -> int:
    """The local cluster's size: `requested`, else one worker per report up to the cores and to
    what the machine's memory holds of the largest report's analysis."""
    if requested:
        return max(1, min(int(requested), len(paths)))
    cores = os.cpu_count() or 1
    n = min(len(paths), cores)
    mem = _total_memory()
    if mem:
        largest = max((p.stat().st_size for p in paths if p.is_file()), default=0)
        per = max(MEMORY_PER_REPORT_MIN, MEMORY_PER_REPORT_FACTOR * largest)
        n = min(n, max(1, mem // per))
    return max(1, n)


def _fail(outcome: ReportFailure):
    raise ReportError(f"{outcome.path}: {outcome.message}", outcome.exit_code)


def map_reports(paths: list[Path], fn: Callable, step_regex: str | None = None, rules: str | None = None,
                cache: bool = True, strict: bool = False, *, scheduler: str | None = None, workers: int | None = None,
                processes: bool = True, timeout: float | None = None) -> list[ReportResult]:
    """Each report's ReportResult, in the order of `paths` (see the module doc for where they run):
    `fn(path, step_regex, rules, cache, strict)` on each (library.report_outcome: given by the
    caller, so that this module does not import the library that imports it)."""
    args = [shown(p) for p in paths]
    if scheduler is not None:
        scheduler = scheduler_address.check(scheduler)  # one line for "local", "", "host" ...
    if scheduler is None and (len(paths) == 1 or not have_dask()):
        if len(paths) > 1:
            progress.notice(f"dask is not installed: the {len(paths)} reports are analyzed one after another "
                            "(pip install 'stepscope[dask]' to spread them over the machine's cores)")
        return _serial(args, step_regex, rules, cache, strict, fn)
    if not have_dask():
        raise StepscopeError("--scheduler needs dask.distributed: pip install 'stepscope[dask]'")
    return _on_dask(args, paths, step_regex, rules, cache, strict, scheduler, workers, processes,
                    timeout or timeout_s(), fn)


def _serial(args, step_regex, rules, cache, strict, fn) -> list[ReportResult]:
    out = []
    for i, a in enumerate(args):
        if len(args) > 1:
            progress.stage(f"report {i + 1} of {len(args)}: {Path(a).name}")
        o = fn(a, step_regex, rules, cache, strict)
        if isinstance(o, ReportFailure):
            _fail(o)
        out.append(o)
    return out


def map_windows(jobs: list, fn: Callable, step_regex: str | None, rules: str | None, *, scheduler: str | None = None,
                workers: int | None = None, processes: bool = True, timeout: float | None = None,
                shared=None) -> list:
    """Each window job's result, in the order of `jobs` (by_windows.py: one long report's
    windows), on the dask cluster at `scheduler` or a local one of `workers` workers (default:
    one per core, each holding one window at a time); `fn(job, step_regex, rules, cache, strict,
    shared=shared)`, `shared` sent once to every worker (the report's reader, as it opened it)."""
    if scheduler is not None:
        scheduler = scheduler_address.check(scheduler)
    if not have_dask():
        raise StepscopeError("--scheduler and --workers need dask.distributed: pip install 'stepscope[dask]'")
    n = max(1, min(int(workers or (os.cpu_count() or 1)), len(jobs)))
    return _on_dask(jobs, None, step_regex, rules, False, False, scheduler, n, processes, timeout or timeout_s(), fn,
                    noun="windows", shared=shared)


def _on_dask(args, paths, step_regex, rules, cache, strict, scheduler, workers, processes, timeout, fn,
             noun: str = "reports", shared=None):
    import logging

    import dask
    from distributed import Client, LocalCluster

    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as e:
            raise StepscopeError(scheduler_address.unreachable(scheduler, str(e))) from None
        with client:
            return _gather(client, args, step_regex, rules, cache, strict, timeout, fn,
                           f"the dask cluster at {scheduler}", noun, shared)
    n = local_workers(paths, workers) if paths is not None else workers
    cores = os.cpu_count() or 1
    progress.stage(f"starting {n} dask worker(s) for {len(args)} {noun}")
    # a worker that dies fails its report at once: a retry would only kill the next worker
    # one task per worker at a time (no second report queued on it: a dying worker takes only
    # its own report with it, and a worker never holds two reports)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0,
                          "distributed.scheduler.worker-saturation": 1.0,
                          "distributed.worker.daemon": False}):
        kw = dict(n_workers=n, threads_per_worker=1, processes=processes, dashboard_address=None,
                  silence_logs=logging.CRITICAL)
        if processes:
            kw["env"] = {"POLARS_MAX_THREADS": str(max(1, cores // n))}
        with LocalCluster(**kw) as cluster, Client(cluster) as client:
            return _gather(client, args, step_regex, rules, cache, strict, timeout, fn, "the local dask cluster",
                           noun, shared)


def _gather(client, args, step_regex, rules, cache, strict, timeout, fn, where, noun: str = "reports",
            shared=None) -> list:
    from distributed import wait
    from distributed.scheduler import KilledWorker

    extra = {} if shared is None else {"shared": client.scatter(shared, broadcast=True)}
    futures = client.map(fn, args, step_regex=step_regex, rules=rules, cache=cache, strict=strict, pure=False,
                         **extra)
    index = {f.key: i for i, f in enumerate(futures)}
    out: list = [None] * len(args)
    pending = set(futures)
    last = workerless = time.monotonic()
    try:
        while pending:
            try:
                done, pending = wait(pending, timeout=POLL_S, return_when="FIRST_COMPLETED")
            except TimeoutError:
                done = set()
            now = time.monotonic()
            killed = sorted(index[f.key] for f in done if f.status == "error" and isinstance(f.exception(), KilledWorker))
            if killed:
                also = f" (and {len(killed) - 1} more of the {noun} queued on that worker)" if len(killed) > 1 else ""
                raise ReportError(f"{args[killed[0]]}: the dask worker analyzing it died{also} (out of memory? each "
                                  f"worker needs one {noun[:-1]}'s analysis in memory): not analyzed", 2)
            for f in sorted(done, key=lambda f: index[f.key]):
                i = index[f.key]
                if f.status == "error":
                    exc = f.exception()
                    raise ReportError(f"{args[i]}: failed on {where} ({type(exc).__name__}: {exc})", 3)
                if f.status != "finished":
                    raise ReportError(f"{args[i]}: its task was {f.status} on {where}", 3)
                o = f.result()
                if isinstance(o, ReportFailure):
                    _fail(o)
                out[i] = o
                last = now
            if done:
                progress.bar(f"{noun} analyzed on {where}", sum(o is not None for o in out), len(args))
            if client.scheduler_info().get("workers"):
                workerless = now
            else:
                last = now  # the no-progress clock runs only while some worker could make progress
            if now - workerless > WORKERLESS_S:
                raise ReportError(f"{where} has had no worker for {WORKERLESS_S:.0f} s: "
                                  f"{len(pending)} {noun} not analyzed, e.g. {args[index[next(iter(pending)).key]]}", 2)
            if pending and now - last > timeout:
                left = sorted(index[f.key] for f in pending)
                raise ReportError(f"{args[left[0]]}: not analyzed after {timeout:.0f} s on {where} (no report "
                                  f"finished meanwhile; {len(left)} still running; STEPSCOPE_REPORT_TIMEOUT_S "
                                  "sets the limit)", 2)
    finally:
        if pending:
            client.cancel(list(pending), force=True)
    return out
