"""ncu CSV reader: raw page with ==PROF== lines, units rows, thousands separators, errors."""

from pathlib import Path

import pytest

from stepscope.bytes import ncu
from stepscope.errors import EnvironmentProblem, InputError

DATA = Path(__file__).parent / "bytes_data"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_scaled_units_and_log_lines():
    # handmade: ncu's auto-scaled units (Mbyte, usecond); the real files use --print-units base
    res = ncu.parse_files([DATA / "ncu_raw_sample.csv"])
    assert len(res.launches) == 2
    assert res.metrics == list(ncu.DEFAULT_METRICS)
    assert any(ln.startswith("==PROF== Connected") for ln in res.log_lines)
    gemm = ncu.launch_record(res.launches[0])
    assert gemm["kernel"] == "nvjet_tst_128x128_64x4_2x1_v_bz_TNT"
    assert gemm["dram_read_bytes"] == 113_930_000  # 113.93 Mbyte, SI
    assert gemm["dram_write_bytes"] == 20_920_000
    assert gemm["duration_ns"] == 61_450  # 61.45 usecond
    assert gemm["l2_hit_pct"] == pytest.approx(61.8)
    assert (gemm["grid_x"], gemm["grid_y"], gemm["grid_z"]) == (112, 1, 1)
    assert (gemm["block_x"], gemm["block_y"], gemm["block_z"]) == (384, 1, 1)
    red = ncu.launch_record(res.launches[1])
    assert "splitKreduce_kernel" in red["kernel"]  # commas inside the quoted name survive
    assert (red["grid_x"], red["grid_y"]) == (4, 96)


def test_base_units_thousands_and_na():
    # handmade: n/a values and a grid with a thousands separator, which the real H200 files
    # (tests/test_bytes_real.py) do not have
    res = ncu.parse_files([DATA / "ncu_raw_base_units.csv"])
    recs = [ncu.launch_record(d) for d in res.launches]
    assert [r["id"] for r in recs] == [0, 1, 2, 3]
    assert recs[1]["grid_x"] == 1002  # "(1,002, 1, 1)"
    assert recs[3]["dram_read_bytes"] is None  # n/a is reported as missing, not 0
    assert recs[3]["dram_write_bytes"] == 1024


def test_several_blocks_in_one_real_text():
    """The committed H200 raw text: 6 ncu runs concatenated, `==STEPSCOPE==` separators."""
    raw = FIXTURES / "ncu" / "h200_llama8b_ncu_raw.csv"
    text = raw.read_text()
    res = ncu.parse_text(text, "h200")
    blocks = text.count('\n"ID","Process ID"') + text.startswith('"ID"')
    assert blocks == 6
    ids = [d["id"] for d in res.launches]
    assert ids.count(0) == blocks  # each block restarts its IDs
    assert len(res.launches) == sum(1 for ln in text.splitlines() if ln[:2] == '"' + ln[1:2]
                                    and ln[1:2].isdigit())


def test_details_long_form():
    text = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"',
        '"0","1","p","h","k1","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler '
        'metrics","dram__bytes_read.sum","Kbyte","1,234.5"',
        '"0","1","p","h","k1","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler '
        'metrics","dram__bytes_write.sum","byte","512"',
    ])
    res = ncu.parse_text(text)
    assert len(res.launches) == 1
    r = ncu.launch_record(res.launches[0])
    assert r["dram_read_bytes"] == 1_234_500 and r["dram_write_bytes"] == 512


def test_missing_dram_metrics_is_an_input_error():
    with pytest.raises(InputError, match="dram__bytes_read.sum"):
        ncu.parse_files([DATA / "ncu_no_dram.csv"])


def test_empty_file():
    with pytest.raises(InputError, match="empty"):
        ncu.parse_files([DATA / "ncu_empty.csv"])


def test_counter_permission():
    with pytest.raises(EnvironmentProblem, match="ERR_NVGPUCTRPERM"):
        ncu.parse_files([DATA / "ncu_perm.csv"])


def test_missing_file():
    with pytest.raises(InputError, match="no such file"):
        ncu.parse_files([DATA / "nope.csv"])


@pytest.mark.parametrize("text,unit,want", [
    ("1,234", None, 1234.0), ("2.5", "Gbyte", 2.5e9), ("n/a", "byte", None), ("", None, None),
    ("3", "msecond", 3e6), ("7", "KiB", 7 * 1024),
])
def test_parse_number(text, unit, want):
    assert ncu.parse_number(text, unit) == want
