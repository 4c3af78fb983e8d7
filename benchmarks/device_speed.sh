#!/usr/bin/env bash
# The issue-31 bars measured on the H200 machine's host (16 cores) instead of the 2-core box:
# `benchmarks/run.py --sizes 1M --reps 5` there, on a 1M trace inflated there from the committed
# fixture (Python 3.12; nothing of stepscope's is compiled: SQLite reads the export through ADBC).
#
# The wheels (Python 3.12, manylinux) do not fit one call beside the working tree, so they travel
# as a tar in five parts, one call each, to /tmp/wc (a warm machine keeps /tmp), then `run`:
#
#   here:  mkdir .whl; pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl \
#            polars==2.1.0 polars-runtime-32==2.1.0 typer==0.28.0 regex orjson adbc-driver-sqlite==1.13.0 \
#            adbc-driver-manager==1.13.0 nsys-ai==0.3.0 duckdb==1.5.5 duckdb-extension-sqlite-scanner==1.5.5 \
#            duckdb-extensions
#          tar cf /tmp/wheels.tar -C .whl . && split -b 19500000 -d -a 1 /tmp/wheels.tar /tmp/wpart.
#          one part each into .wc1 … .wc5 (all five listed in .git/info/exclude)
#   device: bash benchmarks/device_speed.sh carry N      (carry: [".wcN"]), N = 1 … 5, back to back
#           bash benchmarks/device_speed.sh run          (no carry)
#           bash benchmarks/device_speed.sh memory       (no carry; after run, on the same warm machine:
#           what fresh pages cost there, cold runs under the allocators' settings and keeping what they
#           free, interleaved, and benchmarks/inprocess_rounds.py under both)
#           bash benchmarks/device_speed.sh arenas       (no carry; native.py's one jemalloc arena against
#           jemalloc's default of four per core, interleaved, then run.py)
set -u
PART="${1:?carry N | run}"
if [ "$PART" = carry ]; then
  N="${2:?N}"
  if [ "$N" != 1 ]; then test -d /tmp/wc || { echo "fresh machine: start again at carry 1"; exit 9; }; fi
  mkdir -p /tmp/wc && cp ".wc$N"/* /tmp/wc/ && ls -la /tmp/wc
  exit
fi
install() {  # the carried wheels into /tmp/site
  cat /tmp/wc/wpart.* > /tmp/wheels.tar || exit 9
  mkdir -p /tmp/whl && tar xf /tmp/wheels.tar -C /tmp/whl || exit 9
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/whl/*.whl || exit 9
  export PYTHONPATH="/tmp/site" PATH="/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1
}
ready() {  # a later part on a warm machine: the installed wheels, else installed now; the 1M trace
  if [ -d /tmp/site ]; then export PYTHONPATH="/tmp/site" PATH="/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1; else set -x; install; set +x; fi
  test -f bench-out/llama8b_decode_b1_eager_1M.sqlite || python3 benchmarks/inflate.py --sizes 1M || exit 9
}
OUT="${OUT:-$PWD/device-speed-out}"
mkdir -p "$OUT"
if [ "$PART" = arenas ]; then  # native.py's narenas:1 against jemalloc's default (4 per core), interleaved
  exec > >(tee "$OUT/device_arenas.log") 2>&1
  ready
  for r in 1 2 3 4 5 6; do
    for conf in "narenas:$((4 * $(nproc)))" ""; do
      _RJEM_MALLOC_CONF="$conf" /usr/bin/time -f "cold [${conf:-narenas:1}]: %e s wall %U user %S sys %M KB %R minflt" \
        python3 -m stepscope analyze bench-out/llama8b_decode_b1_eager_1M.sqlite --json --steps all --no-cache >/dev/null
    done
  done
  python3 benchmarks/run.py --sizes 1M --reps 5 --results "$OUT/results_h200_host.md" || true
  exit
fi
if [ "$PART" = memory ]; then
  exec > >(tee "$OUT/device_memory.log") 2>&1
  ready
  python3 benchmarks/fresh_pages.py
  KEEP="_RJEM_MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 GLIBC_TUNABLES=glibc.malloc.trim_threshold=4294967295"
  for r in 1 2 3 4 5; do
    for mode in default keep; do
      e=""; [ $mode = keep ] && e="$KEEP"
      env $e /usr/bin/time -f "cold $mode: %e s wall %U user %S sys %M KB %R minflt" \
        python3 -m stepscope analyze bench-out/llama8b_decode_b1_eager_1M.sqlite --json --steps all --no-cache >/dev/null
    done
  done
  export F=bench-out/llama8b_decode_b1_eager_1M.sqlite ROUNDS=3
  echo "in-process, default:"; python3 benchmarks/inprocess_rounds.py
  echo "in-process, keeping:"; env $KEEP python3 benchmarks/inprocess_rounds.py
  exit
fi
exec > >(tee "$OUT/device_speed.log") 2>&1
set -x
install
set +x
{ nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|MHz'; free -g | head -2; python3 --version
  python3 -c 'import polars, numpy, sqlite3; print("polars", polars.__version__, "numpy", numpy.__version__, "sqlite", sqlite3.sqlite_version)'
  python3 -c 'import adbc_driver_sqlite as a; print("adbc-driver-sqlite", a.__version__)'; } 2>&1
python3 benchmarks/inflate.py --sizes 1M || exit 9
python3 benchmarks/run.py --sizes 1M --reps 5 --results "$OUT/results_h200_host.md" || true
# three cold runs under /usr/bin/time: user and sys time and page faults, which run.py does not report
for i in 1 2 3; do /usr/bin/time -f "cold: %e s wall %U user %S sys %M KB %R minflt" \
  python3 -m stepscope analyze bench-out/llama8b_decode_b1_eager_1M.sqlite --json --steps all --no-cache >/dev/null; done
