#!/usr/bin/env bash
# Issue 44 on the GPU machine's host (16 cores): one long report's windows and a run's 8 reports,
# on a dask LocalCluster of N workers against serial, in one call each (a warm machine keeps /tmp).
#
# The wheels (Python 3.12, manylinux: polars 2.1, typer, rich, regex, orjson, ADBC's SQLite
# driver, dask and distributed with what they need) travel as a tar in two parts, each beside the
# working tree with the large fixtures moved out of it (the tree must stay under 64 MiB a call):
#
#   here:   pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl <the list>
#           tar cf /tmp/wheels.tar -C .whl . && split -b 34000000 -d -a 1 /tmp/wheels.tar /tmp/wpart.
#           /tmp/wpart.0 into .wa, the rest into .wb (both in .git/info/exclude)
#   device: bash benchmarks/device_windows.sh carry .wa        (carry: [".wa"])
#           bash benchmarks/device_windows.sh windows .wb      (carry: [".wb"]): installs, inflates the
#             48-request serving run to 25M kernels there, then `analyze --json --no-cache` of it
#             serially (as analyze runs it: by windows) and with --workers 4, 8, 16, interleaved,
#             each with its wall and peak RSS, the documents compared byte for byte
#           bash benchmarks/device_windows.sh reports               (no carry): benchmarks/many_reports.py,
#             8 reports of 1M kernels, serial and dask with 16 workers; then the 25M trace whole
#             (--window-steps 0), its wall and peak RSS
set -u
PART="${1:?carry DIR | windows DIR | reports}"
OUT="${OUT:-$PWD/device-windows-out}"
mkdir -p "$OUT" /tmp/wc
LOG="$OUT/$PART.log"
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:/tmp/site"
if [ "$PART" = carry ] || [ "$PART" = windows ]; then cp "${2:?DIR}"/* /tmp/wc/ && ls -la /tmp/wc; fi
[ "$PART" = carry ] && exit 0
if [ ! -d /tmp/site ]; then
  cat /tmp/wc/wpart.* > /tmp/wheels.tar && mkdir -p /tmp/whl && tar xf /tmp/wheels.tar -C /tmp/whl || exit 9
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/whl/*.whl || exit 9
fi
nproc; free -g | head -2; python3 --version
python3 -c "import polars, distributed; print('polars', polars.__version__, 'distributed', distributed.__version__)"
T=bench-out/llama-3.1-8b_serve_r48_s0_graph_25M.sqlite
run() {  # run LABEL ARGS...: one analyze in a fresh process, its wall and peak RSS (its own and
  # its dask workers', each a child of the cluster's)
  local label="$1"; shift
  python3 - "$label" "$T" "$@" <<'PY'
import resource, subprocess, sys, time
label, trace, *args = sys.argv[1:]
t = time.perf_counter()
with open(f"/tmp/{label}.json", "wb") as out:
    rc = subprocess.run([sys.executable, "-m", "stepscope", "analyze", trace, "--json", "--no-cache", *args],
                        stdout=out).returncode
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{label}: exit {rc}, {wall:.1f} s wall, {ru.ru_utime:.1f} s user, largest process {ru.ru_maxrss / 1024:,.0f} MiB peak RSS")
PY
  md5sum "/tmp/$label.json"
}
if [ "$PART" = windows ]; then
  [ -f "$T" ] || python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
import serving_scale as s, inflate as i
from pathlib import Path
print(i.inflate(s.unpacked(Path('bench-out')), i.parse_size('25M'), Path('bench-out')).counts)" || exit 9
  for round in $(seq "${ROUNDS:-2}"); do
    run "serial_r$round"
    for w in 16 8 4; do run "workers${w}_r$round" --workers $w; done
  done
  exit 0
fi
if [ "$PART" = reports ]; then
  timeout 300 python3 benchmarks/many_reports.py --rounds 1 --workers 16 --kernels 1M --out /tmp/many
  run whole --window-steps 0
  md5sum /tmp/*.json
  exit 0
fi
echo "unknown part $PART"; exit 2
