"""CUDA API call names stepscope looks at, matched by prefix (exports carry version suffixes
such as `cudaLaunchKernel_v7000`). The readers keep only these calls; the analyses flag them."""

import re

LAUNCH = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch")
GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch")
# Calls that block the host until the device has drained (DEFINITIONS.md, "sync" gaps).
SYNC = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
        "cuStreamSynchronize", "cuEventSynchronize")
# A copy without "Async" blocks too: cudaMemcpy_v3020, cudaMemcpy2D…, cuMemcpyDtoH_v2.
BLOCKING_COPY = re.compile(r"^(cudaMemcpy(2D|3D)?(ToSymbol|FromSymbol|Peer)?|cuMemcpy(DtoH|HtoD|DtoD)?)(_v\d+)?$")
COPY_SET = ("cudaMemcpy", "cuMemcpy", "cudaMemset", "cuMemset")
PROFILER_START = ("cudaProfilerStart", "cuProfilerStart")
PROFILER_STOP = ("cudaProfilerStop", "cuProfilerStop")
# Stream capture into a CUDA graph and its instantiation: an engine's start-up (DEFINITIONS.md,
# "Start-up"); a captured launch runs nothing until the graph is replayed.
GRAPH_CAPTURE = ("cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate", "cuStreamBeginCapture",
                 "cuStreamEndCapture", "cuGraphInstantiate")

# Every call an analysis uses: launches (incl. memcpy/memset calls, which launch memops), syncs,
# the profiler's capture-range calls and graph capture.
KEPT = LAUNCH + COPY_SET + SYNC + PROFILER_START + PROFILER_STOP + GRAPH_CAPTURE
