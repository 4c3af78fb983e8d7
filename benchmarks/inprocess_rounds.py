#!/usr/bin/env python3
"""`analyze FILE --json --steps all --no-cache` run ROUNDS times in one process (the CLI's own
run(), stdout to /dev/null), each round's wall, CPU, sys time, minor page faults and RSS.

What a cold run costs apart from the memory it touches fresh: on the Firecracker VMs here a page
touched for the first time costs microseconds (benchmarks/fresh_pages.py). Under the allocators'
own settings (native.py) each round hands its memory back and faults it in again; with them
keeping what is freed (_RJEM_MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 and
GLIBC_TUNABLES=glibc.malloc.trim_threshold=4294967295) later rounds touch little fresh memory.

    F=bench-out/llama8b_decode_b1_eager_1M.sqlite ROUNDS=3 python benchmarks/inprocess_rounds.py
"""
import gc
import os
import resource
import sys
import time

T0 = time.perf_counter()
gc.disable()
# the checkout this script is in, as `python -m stepscope` run from its root would find it
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepscope import native  # noqa: E402

native.setup()
import numpy  # noqa: E402,F401
import stepscope.analysis.diagnosis  # noqa: E402,F401
import stepscope.analysis.inventory  # noqa: E402,F401
import stepscope.cli as cli  # noqa: E402
import stepscope.library  # noqa: E402,F401
import stepscope.render.json  # noqa: E402,F401


def usage():
    x = resource.getrusage(resource.RUSAGE_SELF)
    return x.ru_utime + x.ru_stime, x.ru_stime, x.ru_minflt


def rss():
    return {k: int(v.split()[0]) // 1024 for k, v in (line.split(":") for line in open("/proc/self/status"))
            if k in ("VmHWM", "VmRSS")}


print(f"imports {time.perf_counter() - T0:.3f} s")
# floor2 (benchmarks/run.py) in this process, before the rounds: their ratio to it is this run's
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import floor_scan  # noqa: E402

floor2 = min(floor_scan(os.environ["F"], both=True)[0] for _ in range(5))
print(f"floor2 {floor2:.3f} s (best of 5)")
for i in range(int(os.environ.get("ROUNDS", "3"))):
    sys.argv = ["stepscope", "analyze", os.environ["F"], "--json", "--steps", "all", "--no-cache"]
    a, t = usage(), time.perf_counter()
    out, sys.stdout = sys.stdout, open(os.devnull, "w")
    try:
        cli.run()
    except SystemExit:
        pass
    sys.stdout.flush()
    sys.stdout = out
    b = usage()
    wall = time.perf_counter() - t
    print(f"round {i}: wall {wall:.3f} s, CPU {b[0] - a[0]:.2f} s, sys {b[1] - a[1]:.2f} s, "
          f"faults {b[2] - a[2]}, RSS {rss()} MiB, {wall / floor2:.1f}x floor2")
os._exit(0)
