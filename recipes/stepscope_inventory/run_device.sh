#!/usr/bin/env bash
# Run the stepscope_inventory nsys recipe under the GPU box's own nsys, and record what it took.
#   bash recipes/stepscope_inventory/run_device.sh [REPORT.nsys-rep|.sqlite ...]
# From the repository root. Without arguments: the .nsys-rep reports left by the capture scripts
# under $STEPSCOPE_WORK (default /tmp/stepscope-capture), else the committed fixtures' .sqlite.
# Results and a log in $OUT/recipe (default ./capture-out/recipe).
cd "$(dirname "$0")/../.." || exit 1
source fixtures/capture_lib.sh            # NSYS, PYTHONPATH (stepscope + carried polars), $OUT, $LOG
RLOG="$OUT/recipe_log.txt"
REPORTS=("$@")
[ ${#REPORTS[@]} -gt 0 ] || mapfile -t REPORTS < <(ls "$WORK"/*/*.nsys-rep 2>/dev/null)
[ ${#REPORTS[@]} -gt 0 ] || REPORTS=(fixtures/llama8b_decode_b1_eager.sqlite fixtures/llama8b_decode_b8_eager.sqlite)
PKG="$(dirname "$NSYS")/python/packages"
{
  echo "# nsys recipe stepscope_inventory  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nsys: $NSYS ($("$NSYS" --version 2>&1 | tail -1))"
  echo "nsys_recipe package: $PKG/nsys_recipe $( [ -d "$PKG/nsys_recipe" ] && echo present || echo MISSING)"
  echo "python3: $(command -v python3) $(python3 --version 2>&1)"
  for m in pandas numpy dask pyarrow polars; do
    echo "  import $m: $(python3 -c "import $m; print($m.__version__)" 2>&1 | tail -1)"
  done
  echo "requirements nsys lists:"; cat "$PKG"/nsys_recipe/requirements/*.txt 2>/dev/null | sed 's/^/  /'
  echo "reports: ${REPORTS[*]}"
} >"$RLOG" 2>&1
rm -rf "$OUT/recipe"
NSYS_RECIPE_PATH="$PWD/recipes" timeout 600 "$NSYS" recipe stepscope_inventory \
  --input "${REPORTS[@]}" --output "$OUT/recipe" --csv >>"$RLOG" 2>&1
echo "exit: $?" >>"$RLOG"
ls -la "$OUT/recipe" >>"$RLOG" 2>&1
head -40 "$OUT/recipe/summary.csv" >>"$RLOG" 2>&1
cat "$RLOG"
