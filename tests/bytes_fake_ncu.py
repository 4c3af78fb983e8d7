#!/usr/bin/env python3
"""A stand-in for `ncu` in CPU tests: prints what ncu --csv --page raw would for the sentinel.

It does not run the program. For `--cells FILE --marker --manifest M` it writes the manifest
the sentinel would (cells whose op is "argmax" at m=2048 fail, to exercise error handling)
and prints one marker launch plus one kernel launch per successful cell. `--version` prints a
version line. FAKE_NCU_MODE=perm prints ERR_NVGPUCTRPERM; =nometrics drops the dram columns.
"""

import json
import os
import sys

args = sys.argv[1:]
if "--version" in args:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2099.1.0.0 (fake)")
    sys.exit(0)
mode = os.environ.get("FAKE_NCU_MODE", "")
if mode == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
          "Performance Counters on the target device 0.")
    sys.exit(1)


def opt(name):
    return args[args.index(name) + 1] if name in args else None


if opt("--cells"):
    specs = json.load(open(opt("--cells")))
else:
    specs = [{"cell": "single", "op": opt("--op"), "m": int(opt("--m") or 1)}]
man = opt("--manifest")
marker = "--marker" in args
hdr = ['ID', 'Process ID', 'Process Name', 'Host Name', 'Kernel Name', 'Context', 'Stream',
       'Block Size', 'Grid Size', 'Device', 'CC', 'dram__bytes_read.sum',
       'dram__bytes_write.sum', 'gpu__time_duration.sum', 'lts__t_sector_hit_rate.pct']
units = ['', '', '', '', '', '', '', '', '', '', '', 'byte', 'byte', 'nsecond', '%']
if mode == "nometrics":
    hdr, units = hdr[:11] + hdr[13:], units[:11] + units[13:]
rows = []
lines = []
i = 0
for sp in specs:
    fail = sp["op"] == "argmax" and sp.get("m") == 2048
    rec = {"cell": sp["cell"], "gpu": "NVIDIA H200", "ok": not fail, "marker": marker,
           "error": "RuntimeError: boom" if fail else None}
    lines.append(json.dumps(rec))
    if marker:
        rows.append([str(i), "1", "python3", "127.0.0.1", "spin_kernel", "1", "7",
                     "(1, 1, 1)", "(1, 1, 1)", "0", "9.0", "0", "0", "1,024", "0"])
        i += 1
    if fail:
        continue
    name = {"gemm": "nvjet_tst_128x8_64x12_2x1_v_bz_TNT", "norm": "rms_norm_kernel"}.get(
        sp["op"], f"{sp['op']}_kernel")
    m = int(sp.get("m") or 1)
    rows.append([str(i), "1", "python3", "127.0.0.1", name, "1", "7", "(128, 1, 1)",
                 f"({max(1, m // 16)}, 1, 1)", "0", "9.0", f"{m * 1000:,}", f"{m * 10:,}",
                 "5,120", "61.8"])
    i += 1
if man:
    with open(man, "w") as f:
        f.write("\n".join(lines) + "\n")
print("==PROF== Connected to process 1 (/usr/bin/python3)")
for r in rows:
    print(f'==PROF== Profiling "{r[4]}" - {r[0]}: 0%....50%....100% - 1 pass')
print("==PROF== Disconnected from process 1")


def q(vals):
    return ",".join(f'"{v}"' for v in vals)


print(q(hdr))
print(q(units))
for r in rows:
    if mode == "nometrics":
        r = r[:11] + r[13:]
    print(q(r))
