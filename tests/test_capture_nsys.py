"""nsys discovery against fake install trees, the Nsight Compute layout trick, the importer
check and the exact `nsys profile` command line."""

from __future__ import annotations

import os
import stat
from pathlib import Path


from stepscope.capture import nsys
from stepscope.capture.doctor import check_nsys

VERSION_OUT = "NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0"


def exe(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# A fake nsys that, like the real one, looks for its importer next to its *resolved* folder.
FAKE_NSYS = f"""
if [ "$1" = "--version" ]; then echo "{VERSION_OUT}"; exit 0; fi
here="$(dirname "$(readlink -f "$0")")"
test -x "$here/../host-linux-x64/QdstrmImporter" || {{ echo "importer missing" >&2; exit 7; }}
echo ok
"""


def ncu_tree(root: Path, version: str = "2025.3.1") -> Path:
    base = root / "opt/nvidia/nsight-compute" / version / "host"
    n = exe(base / "target-linux-x64/nsys", FAKE_NSYS)
    (base / "target-linux-x64/libToolsInjection64.so").write_text("lib")
    (base / "target-linux-x64/python/lib").mkdir(parents=True)
    (base / "target-linux-x64/python/lib/x.py").write_text("")
    exe(base / "linux-desktop-glibc_2_11_3-x64/QdstrmImporter", "exit 0")
    return n


def systems_tree(root: Path, version: str = "2025.1.1") -> Path:
    base = root / "opt/nvidia/nsight-systems" / version
    n = exe(base / "bin/nsys", FAKE_NSYS.replace("../host-linux-x64", "../host-linux-x64"))
    exe(base / "host-linux-x64/QdstrmImporter", "exit 0")
    return n


EMPTY_ENV = {"PATH": ""}


def test_nothing_found(tmp_path):
    assert nsys.candidates(EMPTY_ENV, tmp_path) == []
    assert nsys.discover(EMPTY_ENV, tmp_path, tmp_path / "cache") is None
    info = check_nsys(EMPTY_ENV, str(tmp_path), tmp_path / "cache")
    assert not info["ok"] and "not found" in info["problem"] and "NSYS" in info["fix"]


def test_search_order_and_newest_first(tmp_path):
    old = ncu_tree(tmp_path, "2024.10.2")
    new = ncu_tree(tmp_path, "2025.3.1")
    sysn = systems_tree(tmp_path)
    cuda = exe(tmp_path / "usr/local/cuda-12.8/bin/nsys", FAKE_NSYS)
    got = [c.path for c in nsys.candidates(EMPTY_ENV, tmp_path)]
    assert got == [sysn, cuda, new, old]
    sources = [c.source for c in nsys.candidates(EMPTY_ENV, tmp_path)]
    assert sources == ["nsight-systems", "cuda-toolkit", "nsight-compute", "nsight-compute"]


def test_env_and_path_come_first(tmp_path):
    systems_tree(tmp_path)
    mine = exe(tmp_path / "mine/nsys", FAKE_NSYS)
    onpath = exe(tmp_path / "bin/nsys", FAKE_NSYS)
    env = {"NSYS": str(mine), "PATH": str(tmp_path / "bin")}
    got = nsys.candidates(env, tmp_path)
    assert [c.source for c in got][:2] == ["$NSYS", "PATH"]
    assert got[0].path == mine and got[1].path == onpath
    # $NSYS may name the folder
    got = nsys.candidates({"NSYS": str(tmp_path / "mine"), "PATH": ""}, tmp_path)
    assert got[0].path == mine


def test_full_install_needs_no_arranging(tmp_path):
    n = systems_tree(tmp_path)
    found = nsys.discover(EMPTY_ENV, tmp_path, tmp_path / "cache")
    assert found.path == n and found.original is None
    assert found.importer == n.parent.parent / "host-linux-x64/QdstrmImporter"
    assert not (tmp_path / "cache").exists()


def test_nsight_compute_copy_gets_the_host_linux_x64_layout(tmp_path):
    n = ncu_tree(tmp_path)
    cache = tmp_path / "cache"
    assert nsys.find_importer(n) is None  # as shipped, nsys cannot find its importer
    import subprocess

    assert subprocess.run([str(n)], capture_output=True).returncode == 7
    found = nsys.discover(EMPTY_ENV, tmp_path, cache)
    assert found.original == n and found.source == "nsight-compute"
    assert found.path.parent.name == "target-linux-x64"
    assert found.path.parent.parent.parent == cache
    host = found.path.parent.parent / "host-linux-x64"
    assert host.is_symlink()
    assert host.resolve() == (n.parent.parent / "linux-desktop-glibc_2_11_3-x64").resolve()
    assert found.importer == host / "QdstrmImporter"
    # the copy is a real file (not a symlink back to /opt), with the folder's other files
    assert not found.path.is_symlink()
    assert (found.path.parent / "libToolsInjection64.so").read_text() == "lib"
    assert (found.path.parent / "python/lib/x.py").exists()
    # and the fake nsys, resolving its own path, now finds the importer
    cp = subprocess.run([str(found.path)], capture_output=True, text=True)
    assert cp.returncode == 0 and cp.stdout.strip() == "ok"
    # a second discovery reuses the layout
    again = nsys.discover(EMPTY_ENV, tmp_path, cache)
    assert again.path == found.path
    assert nsys.nsys_version(found.path)[0] == "2025.3.1.90"


def test_version_parsing():
    assert nsys.parse_version(VERSION_OUT) == "2025.3.1.90"
    assert nsys.parse_version("NVIDIA Nsight Systems version 2022.4.2.1-df9881f") == "2022.4.2.1"
    assert nsys.parse_version("garbage") is None


def test_importer_missing_libdw_is_named_with_its_fix(tmp_path):
    imp = exe(tmp_path / "QdstrmImporter",
              'echo "QdstrmImporter: error while loading shared libraries: libdw.so.1: '
              'cannot open shared object file: No such file or directory" >&2; exit 127')
    chk = nsys.check_importer(imp)
    assert not chk.ok
    assert chk.problem == "QdstrmImporter cannot load libdw.so.1"
    assert "libdw1" in chk.fix and "LD_LIBRARY_PATH" in chk.fix
    ok = nsys.check_importer(exe(tmp_path / "good/QdstrmImporter", "echo usage; exit 1"))
    assert ok.ok
    none = nsys.check_importer(None)
    assert not none.ok and "host-linux-x64" in none.problem


def test_doctor_reports_libdw(tmp_path):
    n = systems_tree(tmp_path)
    exe(n.parent.parent / "host-linux-x64/QdstrmImporter",
        'echo "error while loading shared libraries: libdw.so.1: cannot open" >&2; exit 127')
    info = check_nsys(EMPTY_ENV, str(tmp_path), tmp_path / "cache")
    assert info["version"] == "2025.3.1.90"
    assert info["importer_runs"] is False and not info["ok"]
    assert "libdw.so.1" in info["problem"] and "libdw1" in info["fix"]


def test_profile_command_is_exact():
    cmd = nsys.profile_command("/x/nsys", "/out/run", ["python", "-m", "m", "--a", "1"])
    assert cmd == [
        "/x/nsys", "profile",
        "--trace=cuda,nvtx",
        "--cuda-graph-trace=node",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--sample=none",
        "--cpuctxsw=none",
        "--trace-fork-before-exec=true",
        "--export=sqlite",
        "--force-overwrite=true",
        "-o", "/out/run",
        "python", "-m", "m", "--a", "1",
    ]


def test_default_cache_dir_honours_env(tmp_path):
    assert nsys.default_cache_dir({"STEPSCOPE_CACHE": str(tmp_path)}) == tmp_path / "nsys"
    assert nsys.default_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == \
        tmp_path / "stepscope" / "nsys"
    assert os.fspath(nsys.default_cache_dir({})).endswith(".cache/stepscope/nsys")
