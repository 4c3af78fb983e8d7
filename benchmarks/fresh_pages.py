#!/usr/bin/env python3
"""What touching fresh memory costs on this machine: 400 MiB mapped anonymously, one byte written
per 4 KiB page (a first touch: the kernel finds, zeroes and maps each page), then again (already
mapped); with and without the huge-page advice; and after MADV_DONTNEED (the pages handed back, as
an allocator's purge does, and faulted in again in the same mapping)."""
import mmap
import time

import numpy as np

N = 400 << 20
PAGES = N // 4096
for advice in ("none", "hugepage"):
    for _ in range(3):
        m = mmap.mmap(-1, N)
        if advice == "hugepage":
            m.madvise(mmap.MADV_HUGEPAGE)
        a = np.frombuffer(m, dtype=np.uint8)
        t = time.perf_counter()
        a[::4096] = 1
        first = time.perf_counter() - t
        t = time.perf_counter()
        a[::4096] = 2
        again = time.perf_counter() - t
        m.madvise(mmap.MADV_DONTNEED)
        t = time.perf_counter()
        a[::4096] = 3
        back = time.perf_counter() - t
        print(f"{advice:8s} first touch {first:.3f} s = {first / PAGES * 1e6:.2f} us/page; mapped {again:.4f} s; "
              f"after MADV_DONTNEED {back:.3f} s = {back / PAGES * 1e6:.2f} us/page")
        del a
        m.close()
