"""Finding Nsight Systems, making it usable, and building its command line.

Where nsys is looked for, in order: `$NSYS` (a file or a directory holding `nsys`), `PATH`,
`/opt/nvidia/nsight-systems/*/bin` (and `target-linux-x64`), the CUDA toolkits
`/usr/local/cuda*/bin`, and the copy bundled inside Nsight Compute,
`/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys`. Newest versions first.

The Nsight Compute copy: nsys runs the `.qdstrm → .nsys-rep` importer (`QdstrmImporter`) from
a folder next to its own called `host-linux-x64`, but Nsight Compute ships that folder as
`host/linux-desktop-glibc_2_11_3-x64/`. `arrange_layout()` builds the expected layout in a
cache dir (`~/.cache/stepscope/nsys/<key>/{target-linux-x64,host-linux-x64}`): the target
folder is re-created with hard links (copies across file systems), because nsys finds its
siblings from its own resolved path and a symlinked binary would resolve back to /opt; the host
folder is a symlink. The importer also needs `libdw.so.1` (Debian/Ubuntu package `libdw1`).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from stepscope.errors import EnvironmentProblem

IMPORTER = "QdstrmImporter"
LIBDW_FIX = (
    "install libdw1 (apt-get install libdw1), or unpack its .deb with "
    "`dpkg -x libdw1_*.deb DIR` and add DIR/usr/lib/x86_64-linux-gnu to LD_LIBRARY_PATH"
)

# (glob under the root, source label); globs are expanded newest version first.
SEARCH_GLOBS: tuple[tuple[str, str], ...] = (
    ("opt/nvidia/nsight-systems/*/bin/nsys", "nsight-systems"),
    ("opt/nvidia/nsight-systems/*/target-linux-x64/nsys", "nsight-systems"),
    ("usr/local/cuda*/bin/nsys", "cuda-toolkit"),
    ("usr/local/cuda*/nsight-systems*/bin/nsys", "cuda-toolkit"),
    ("opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys", "nsight-compute"),
)


@dataclass
class NsysCandidate:
    path: Path  # the nsys executable to run
    source: str  # $NSYS, PATH, nsight-systems, cuda-toolkit, nsight-compute
    original: Path | None = None  # where it was found, when `path` is a rearranged copy
    importer: Path | None = None  # QdstrmImporter as nsys will find it
    notes: list[str] = field(default_factory=list)


def _version_key(p: str) -> tuple:
    """Sort key that orders 2025.3.1 after 2024.10.2 and 12.8 after 12.4."""
    nums = re.findall(r"\d+", p)
    return tuple(int(n) for n in nums)


def _is_exe(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def candidates(env: dict[str, str] | None = None, root: str | os.PathLike = "/") -> list[NsysCandidate]:
    """Every nsys found, in search order, without duplicates (by resolved path).

    `root` lets tests point the fixed locations at a fake install tree.
    """
    env = dict(os.environ if env is None else env)
    found: list[NsysCandidate] = []
    seen: set[str] = set()

    def add(p: Path, source: str) -> None:
        if not _is_exe(p):
            return
        key = str(p.resolve())
        if key in seen:
            return
        seen.add(key)
        found.append(NsysCandidate(path=p, source=source))

    if env.get("NSYS"):
        p = Path(env["NSYS"]).expanduser()
        add(p / "nsys" if p.is_dir() else p, "$NSYS")
    on_path = shutil.which("nsys", path=env.get("PATH", ""))
    if on_path:
        add(Path(on_path), "PATH")
    for pattern, source in SEARCH_GLOBS:
        hits = glob.glob(os.path.join(os.fspath(root), pattern))
        for hit in sorted(hits, key=_version_key, reverse=True):
            add(Path(hit), source)
    return found


def find_importer(nsys: Path) -> Path | None:
    """The QdstrmImporter nsys will run: `../host-linux-x64/` next to its real folder."""
    real = nsys.resolve()
    for base in (real.parent, real.parent.parent / "target-linux-x64"):
        cand = base.parent / "host-linux-x64" / IMPORTER
        if cand.is_file():
            return cand
    return None


def bundled_host_dir(nsys: Path) -> Path | None:
    """Nsight Compute's importer folder (`host/linux-desktop-*-x64`) next to its nsys."""
    real = nsys.resolve()
    if real.parent.name != "target-linux-x64":
        return None
    for d in sorted(real.parent.parent.glob("linux-desktop-*x64"), reverse=True):
        if (d / IMPORTER).is_file():
            return d
    return None


def default_cache_dir(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("STEPSCOPE_CACHE") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "stepscope")
    return Path(base) / "nsys"


def _link_tree(src: Path, dst: Path) -> None:
    """Re-create `src` at `dst`: hard links for files (copies when that fails), same symlinks."""
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in list(dirnames) + filenames:
            s = Path(dirpath) / name
            d = dst / rel / name
            if s.is_symlink():
                if not d.is_symlink():
                    os.symlink(os.readlink(s), d)
                if name in dirnames:
                    dirnames.remove(name)  # do not walk into linked folders
                continue
            if name in dirnames:
                continue
            if d.exists():
                continue
            try:
                os.link(s, d)
            except OSError:
                shutil.copy2(s, d)


def arrange_layout(nsys: Path, cache_dir: Path | None = None) -> NsysCandidate | None:
    """For an nsys whose importer folder has the wrong name (the Nsight Compute copy), build
    `{target-linux-x64, host-linux-x64}` in the cache and return the nsys there; None when
    nothing needs arranging."""
    if find_importer(nsys) is not None:
        return None
    host = bundled_host_dir(nsys)
    if host is None:
        return None
    target = nsys.resolve().parent
    key = hashlib.sha256(str(target).encode()).hexdigest()[:12]
    base = (cache_dir or default_cache_dir()) / key
    new_target = base / "target-linux-x64"
    new_host = base / "host-linux-x64"
    try:
        base.mkdir(parents=True, exist_ok=True)
        _link_tree(target, new_target)
        if new_host.is_symlink() and Path(os.readlink(new_host)) != host:
            new_host.unlink()
        if not new_host.exists() and not new_host.is_symlink():
            os.symlink(host, new_host)
        (base / "SOURCE").write_text(f"{target}\n{host}\n")
    except OSError as e:
        raise EnvironmentProblem(f"cannot arrange the nsys layout in {base}: {e}") from None
    return NsysCandidate(path=new_target / nsys.name, source="nsight-compute", original=nsys,
                         importer=new_host / IMPORTER,
                         notes=[f"importer layout arranged in {base}"])


def discover(env: dict[str, str] | None = None, root: str | os.PathLike = "/",
             cache_dir: Path | None = None, arrange: bool = True) -> NsysCandidate | None:
    """The nsys to use: the first candidate, with its importer layout arranged if needed."""
    for cand in candidates(env, root):
        cand.importer = find_importer(cand.path)
        if cand.importer is None and arrange:
            fixed = arrange_layout(cand.path, cache_dir)
            if fixed is not None:
                return fixed
        return cand
    return None


# --- probing -----------------------------------------------------------------------------
_VERSION_RE = re.compile(r"(\d{4}\.\d+\.\d+(?:\.\d+)?)")


def parse_version(text: str) -> str | None:
    m = _VERSION_RE.search(text)
    return m.group(1) if m else None


def nsys_version(nsys: Path, timeout: float = 60) -> tuple[str | None, str]:
    """(version, raw output) of `nsys --version`."""
    try:
        cp = subprocess.run([str(nsys), "--version"], capture_output=True, text=True,
                            timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return None, str(e)
    raw = (cp.stdout + cp.stderr).strip()
    return parse_version(raw), raw


_MISSING_LIB_RE = re.compile(r"error while loading shared libraries: ([^\s:]+)")


def missing_library(text: str) -> str | None:
    m = _MISSING_LIB_RE.search(text)
    return m.group(1) if m else None


@dataclass
class ImporterCheck:
    ok: bool
    problem: str | None = None  # one line
    fix: str | None = None


def check_importer(importer: Path | None, timeout: float = 30) -> ImporterCheck:
    """Whether QdstrmImporter starts (its shared libraries load)."""
    if importer is None:
        return ImporterCheck(False, f"{IMPORTER} not found next to nsys (host-linux-x64/)",
                             "use a full Nsight Systems install, or the Nsight Compute copy "
                             "(stepscope arranges its layout)")
    try:
        cp = subprocess.run([str(importer), "--help"], capture_output=True, text=True,
                            timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return ImporterCheck(False, f"{IMPORTER} does not start: {e}", None)
    lib = missing_library(cp.stdout + cp.stderr)
    if lib:
        fix = LIBDW_FIX if lib.startswith("libdw") else f"install the package providing {lib}"
        return ImporterCheck(False, f"{IMPORTER} cannot load {lib}", fix)
    return ImporterCheck(True)


# --- command lines -----------------------------------------------------------------------
def profile_command(nsys: str | os.PathLike, output_base: str | os.PathLike,
                    app: list[str], *, extra: list[str] | None = None) -> list[str]:
    """`nsys profile ... -o OUTPUT APP...` as an argument list (never a shell string).

    Capture starts at cudaProfilerStart and stops at cudaProfilerStop; every kernel of a CUDA
    graph gets its own row; child processes (TP ranks, vLLM workers) are traced."""
    cmd = [
        os.fspath(nsys), "profile",
        "--trace=cuda,nvtx",
        "--cuda-graph-trace=node",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--sample=none",
        "--cpuctxsw=none",
        "--trace-fork-before-exec=true",
        "--export=sqlite",
        "--force-overwrite=true",
        "-o", os.fspath(output_base),
    ]
    cmd += list(extra or [])
    return cmd + list(app)


def export_command(nsys: str | os.PathLike, report: str | os.PathLike, output: str | os.PathLike,
                   kind: str = "sqlite") -> list[str]:
    """`nsys export --type=KIND -o OUTPUT REPORT` as an argument list: another export of a
    report nsys already wrote (arrow: one file of Arrow IPC streams, one per table)."""
    return [os.fspath(nsys), "export", f"--type={kind}", "--force-overwrite=true", "--quiet=true",
            "-o", os.fspath(output), os.fspath(report)]


def export_types(nsys: str | os.PathLike, timeout: float = 60) -> set[str]:
    """The export types this nsys names in `nsys export --help` ("Possible values are: sqlite,
    hdf, ..., arrow, arrowdir, and parquetdir." in 2025.3); empty when it does not say."""
    try:
        cp = subprocess.run([os.fspath(nsys), "export", "--help"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return set()
    text = " ".join((cp.stdout + cp.stderr).split())
    m = re.search(r"-t, --type=\s*Possible values are:\s*([^.]*)\.", text)
    return set(re.findall(r"[a-z0-9]+", m.group(1))) - {"and"} if m else set()


def export_arrow(nsys: str | os.PathLike, report: Path, output: Path, timeout: float = 600) -> str | None:
    """Write the Arrow export of `report` beside its SQLite one when this nsys has --type=arrow
    (stepscope reads it without SQLite); None when written, else why not (a note: the SQLite
    export is what the capture needs)."""
    if "arrow" not in export_types(nsys):
        return "this nsys has no --type=arrow export: only the SQLite export was written"
    try:
        cp = subprocess.run(export_command(nsys, report, output, "arrow"), capture_output=True, text=True,
                            timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return f"nsys export --type=arrow did not run ({e})"
    if cp.returncode != 0 or not output.is_file() or output.stat().st_size == 0:
        why = ((cp.stderr or cp.stdout).strip().splitlines() or [""])[-1]
        output.unlink(missing_ok=True)
        return f"nsys export --type=arrow failed (exit {cp.returncode}{': ' + why if why else ''})"
    return None
