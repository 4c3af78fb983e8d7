"""Damaged ncu CSVs and cells files: an unreadable value makes its launch an error row saying
so; a file that is not a cells table is one line. Never exit 3."""

from __future__ import annotations

import shutil

import polars as pl
import pytest
from tests.conftest import CliRunner

from stepscope.bytes.cells import import_ncu, read_cells
from stepscope.cli import app
from tests.conftest import FIXTURES, need, sha256

RAW = FIXTURES / "ncu" / "smoke_ncu_raw.csv"
EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"


def run(*args):
    r = CliRunner().invoke(app, [*map(str, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


@pytest.mark.parametrize("old,new,error", [
    (b'"1', b'"99999999999999999999999999999999', "unreadable"),  # counts beyond 64 bits
    (b'"1', b'"inf', None),                                      # not finite: no value
    (b'"1', b'"1e400', None),
    (b'"1', b'"\xff58.67', "unreadable"),                         # text where a count belongs
])
def test_unreadable_values_make_error_rows(tmp_path, old, new, error):
    p = tmp_path / "raw.csv"
    p.write_bytes(need(RAW).read_bytes().replace(old, new))
    before = sha256(p)
    df = import_ncu([p])
    assert df.height == import_ncu([RAW]).height
    if error:
        assert df["error"].drop_nulls().str.starts_with(error).all() and df["error"].null_count() < df.height
    for args in (["cells", "import", p, "-o", tmp_path / "c.parquet"], ["cells", "show", p],
                 ["budget", EAGER, "--cells", p]):
        r = run(*args)
        assert r.exit_code == 0, (args, r.output)
    assert pl.read_parquet(tmp_path / "c.parquet").height == df.height
    assert sha256(p) == before


def test_a_file_that_is_no_ncu_csv(tmp_path):
    p = tmp_path / "junk.csv"
    p.write_bytes(bytes(range(256)) * 20)
    for args in (["cells", "import", p, "-o", tmp_path / "c.parquet"], ["cells", "show", p], ["budget", EAGER, "--cells", p]):
        r = run(*args)
        assert r.exit_code == 2 and "no profiled launches" in r.output and len(r.output.strip().splitlines()) == 1


def test_a_cells_file_with_columns_of_the_wrong_kind(tmp_path):
    cells = pl.read_parquet(need(FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"))
    bad = tmp_path / "bad.parquet"
    cells.with_columns(pl.col("dram_read_bytes").cast(pl.String)).write_parquet(bad)
    with pytest.raises(Exception, match="column dram_read_bytes is String, not Int64"):
        read_cells(bad)
    r = run("budget", EAGER, "--cells", bad)
    assert r.exit_code == 2 and "not a cells table stepscope wrote" in r.output
    trunc = tmp_path / "t.parquet"
    shutil.copy(need(FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"), trunc)
    trunc.write_bytes(trunc.read_bytes()[:1000])
    r = run("cells", "show", trunc)
    assert r.exit_code == 2 and "not a readable Parquet cells file" in r.output
    assert len(r.output.strip().splitlines()) == 1
