"""A small handmade Kineto trace (the shape torch.profiler writes), with hand-checkable numbers.

3 steps (`ProfilerStep#0..2`, 100 µs apart) × (4 kernels + 1 memcpy) on device 0, stream 7;
each kernel is 5 µs long and launched 2 µs after the previous launch; timestamps have the
~5e12 µs magnitude and the 3-decimal fraction of real traces.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

PID, TID, DEVICE, STREAM = 4242, 4242, 0, 7
BASE_US = 5189949600000  # µs, like real Kineto clocks
KERNELS = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)",
    "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT",
    "void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, float)",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
)


def events(n_steps: int = 3) -> list[dict]:
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "ts": BASE_US, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": DEVICE, "tid": 0, "ts": BASE_US, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "ts": BASE_US, "args": {"name": "spans"}},
    ]
    corr = 100
    for s in range(n_steps):
        t = BASE_US + s * 100
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": PID, "tid": TID,
                   "ts": f"{t}.125", "dur": "60.000", "args": {"External id": 1 + s}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": TID,
                   "ts": f"{t + 1}.000", "dur": "1.000", "args": {}})
        for k, name in enumerate(KERNELS):
            corr += 1
            lt = t + 1 + 2 * k
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID,
                       "ts": f"{lt}.500", "dur": "1.250", "args": {"correlation": corr, "External id": 9}})
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": DEVICE, "tid": STREAM,
                       "ts": f"{t + 10 + 6 * k}.001", "dur": "5.000",
                       "args": {"device": DEVICE, "stream": STREAM, "correlation": corr, "grid": [132, 1, 1],
                                "block": [256, 1, 1], "External id": 9}})
            ev.append({"ph": "s", "id": corr, "pid": PID, "tid": TID, "ts": f"{lt}.500", "cat": "ac2g", "name": "ac2g"})
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": PID, "tid": TID,
                   "ts": f"{t + 20}.000", "dur": "2.000", "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": DEVICE,
                   "tid": STREAM, "ts": f"{t + 40}.000", "dur": "1.500",
                   "args": {"device": DEVICE, "stream": STREAM, "correlation": corr, "bytes": 4096}})
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": PID, "tid": TID,
               "ts": f"{BASE_US + n_steps * 100}.000", "dur": "3.000", "args": {"correlation": corr + 1}})
    return ev


def document(n_steps: int = 3) -> dict:
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_000_000_000, "numSms": 132,
                              "computeMajor": 9, "computeMinor": 0}],
        "traceEvents": events(n_steps),
        "traceName": "handmade",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1790857026000000000,
    }


def write(path: Path, n_steps: int = 3) -> Path:
    text = json.dumps(document(n_steps))
    if str(path).endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path
