"""main()'s error boundary and the options every command shares: bad values are one line and
exit 2, never a traceback, never a hang."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from tests.conftest import FIXTURES, need

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"

# main() with one library call replaced by a failure, in a fresh interpreter
_BOUNDARY = """
import sys
from polars.exceptions import PanicException
import stepscope.library as lib
def boom(*args, **kw):
    raise {exc}
lib.load = boom
sys.argv = ["stepscope", "analyze", sys.argv[1]]
from stepscope.cli import main
main()
"""


@pytest.mark.parametrize("exc", ['PanicException("PyObject pointer is null")',
                                 'ValueError("first line\\nthe failing plan\\nmore")'])
def test_internal_errors_are_one_line_exit_3(exc):
    p = subprocess.run([sys.executable, "-c", _BOUNDARY.format(exc=exc), str(need(EAGER))],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert "internal error" in p.stderr and "STEPSCOPE_DEBUG" in p.stderr


def _one_line_2(args):
    r = CliRunner().invoke(app, list(map(str, args)))
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert r.exception is None or isinstance(r.exception, SystemExit)
    return r.output


@pytest.mark.parametrize("args,needle", [
    (["tp", "--kernels", "10", "--launch-us", "nan", "--device-ms", "1"], "--launch-us nan"),
    (["tp", "--kernels", "10", "--launch-us", "inf", "--device-ms", "1"], "--launch-us inf"),
    (["tp", "--kernels", "10", "--launch-us", "1e308", "--device-ms", "1"], "from 0 to"),
    (["tp", "--kernels", "10", "--launch-us", "5", "--device-ms", "-inf"], "--device-ms -inf"),
    (["tp", "--kernels", "-3", "--launch-us", "5", "--device-ms", "1"], "--kernels -3"),
    (["tp", "--kernels", "10", "--launch-us", "5", "--device-ms", "1", "--collective-us", "nan"], "--collective-us"),
    (["tp", "--widths", "1,²"], "--widths"),
    (["tp", "--widths", "1,99999999999999999999999"], "--widths"),
    (["tp", "--widths", "0,2"], "--widths"),
    (["tp", "--widths", "1,1000000"], "from 1 to 65,536"),
    (["compare", EAGER, EAGER, "--graph-gap-ns", "nan"], "--graph-gap-ns"),
    (["compare", EAGER, EAGER, "--graph-launch-ns", "1e300"], "--graph-launch-ns"),
    (["compare", EAGER, EAGER, "--fail-above", "nan"], "--fail-above"),
    (["budget", EAGER, "--cells", FIXTURES / "ncu" / "h200_llama8b_sweep.parquet", "--batch", "99999999999"], "--batch"),
    (["budget", EAGER, "--cells", FIXTURES / "ncu" / "h200_llama8b_sweep.parquet", "--context", "0"], "--context"),
    (["trace", "--batch", "99999999999"], "--batch 99999999999: at most 100,000"),
    (["trace", "--context", "99999999999999"], "--context"),
    (["analyze", EAGER, "--steps", "²"], "ASCII"),
    (["analyze", EAGER, "--steps", "٣"], "ASCII"),
    (["analyze", EAGER, "--steps", "9" * 5000], "ASCII"),  # past Python's int-parsing limit
    (["analyze", EAGER, "--steps", "5-3"], "runs upwards"),
    (["report", EAGER, "-o", "x.md", "--step", "²"], "(ASCII step numbers), slowest, top:N, kind:WORDS or a comma list of those, not '²'"),
])
def test_bad_numbers_are_one_line_exit_2(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert needle in _one_line_2(args)
    assert not (tmp_path / "x.md").exists()


def test_a_range_of_10_8_steps_is_not_materialized():
    import time

    from stepscope.selection import parse_steps

    t = time.perf_counter()
    assert parse_steps("0-99999999,200000000-299999999", [0, 5, 150_000_000, 250_000_000]) == [0, 5, 250_000_000]
    assert parse_steps("3,1-2,2-4", [0, 1, 2, 3, 4, 5]) == [1, 2, 3, 4]
    assert time.perf_counter() - t < 0.1
    r = CliRunner().invoke(app, ["analyze", str(EAGER), "--json", "--steps", "0-99999999"])
    assert r.exit_code == 0 and '"index": 0' in r.stdout


def test_usage_errors_are_one_line_through_main():
    for args, needle in ((["analyze", "--bogus"], "No such option: --bogus"),
                         (["budget", "x", "--cells", "y", "--batch", "nan"], "'nan' is not a valid int")):
        p = subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and needle in p.stderr and "--help" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and "╭" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "stepscope"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Usage" in p.stdout + p.stderr and "error" not in p.stderr


@pytest.mark.parametrize("text,needle", [
    ('rule = "gemm"\n', "[[rule]] must be an array of tables"),
    ("rule = [1, 2]\n", "[[rule]] #1: must be a table"),
    ('[[rule]]\nclass = 5\npattern = "x"\n', "unknown class 5"),
    ('[[rule]]\nclass = ["gemm"]\npattern = "x"\n', "unknown class ['gemm']"),
    ('[[rule]]\nclass = "gemm"\npattern = ["x"]\n', "needs a non-empty string 'pattern'"),
    ('[[rule]]\nclass = "gemm"\npattern = "x"\nfield = 3\n', "field must be one of"),
    ('[[nvtx]]\nclass = "norm"\npattern = "nvjet[("\n', "bad regex"),
    ('nvtx = "x"\n', "[[nvtx]] must be an array of tables"),
    ("[[rule]\n", "is not a valid TOML rules file"),
])
def test_malformed_rules_files_are_one_line(tmp_path, text, needle):
    f = tmp_path / "rules.toml"
    f.write_text(text)
    assert needle in _one_line_2(["analyze", EAGER, "--rules", f])


def test_rules_files_that_are_not_text_or_not_files(tmp_path):
    f = tmp_path / "rules.toml"
    f.write_bytes(b'[[rule]]\nclass = "gemm"\npattern = "\xff"\n')
    assert "is not a valid TOML rules file" in _one_line_2(["analyze", EAGER, "--rules", f])
    assert "is a directory" in _one_line_2(["analyze", EAGER, "--rules", tmp_path])
    assert "no such file" in _one_line_2(["analyze", EAGER, "--rules", tmp_path / "none.toml"])
