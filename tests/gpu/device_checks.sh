#!/usr/bin/env bash
# Every GPU check in one run, for a borrowed GPU machine with little time on it: build the
# package there, then `counterprof list`, calibrate (the measured ceilings the roofline uses),
# pytest tests/gpu (NVML/GPM meaning, calibrate vs datasheet, the labelled GPU jobs' verdicts
# and roofline), the real NVML tick cost. Each step has its own time limit and one failing
# step does not stop the next; a table of steps goes to the console and $OUT/summary.txt,
# logs and JSON to $OUT/results.tgz (re-packed after every step, so a cut run keeps them),
# the recorded runs to $OUT/runs.tgz. SKIP_INSTALL=1 uses the counterprof already installed;
# FULL_CALIBRATE=1 adds the full calibration (about 80 s on an H200) at the end.
# ONLY="step ..." runs only those steps (a rerun of what failed); GPU_TESTS=tests/gpu/FILE
# narrows the pytest step. Exits 1 when any step failed or timed out (the steps are named at the
# end), 0 only when every step that ran passed; in the pytest step a skipped test is a failure
# (COUNTERPROF_REQUIRE_GPU: tests/gpu/conftest.py), and the GPU jobs' script exits 1 on a verdict
# its job's own figures do not allow.
#
#   OUT=/tmp/gpu-out bash tests/gpu/device_checks.sh [wheels-folder]
#
# wheels-folder (default .whl): wheels of what the machine lacks (cffi, pycparser, duckdb,
# isal, setuptools>=77 for Python 3.12), installed with --no-index into /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}
WORK=/tmp/gpu-work
WHEELS=${1:-.whl}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 COUNTERPROF_GPU_OUT=$WORK
PY=${PYTHON:-python3}
FAILED=()

pack() {
  tar czf "$OUT/results.tgz" -C "$WORK" --exclude='run' --exclude='*.parquet' . 2>/dev/null
}
step() {      # step NAME SECONDS COMMAND...: run it under a limit, log it, note rc and time
  local name=$1 limit=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  local t0 rc ms
  t0=$(date +%s%N)
  echo "=== $name: $*"
  timeout -k 10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  tail -n "${TAIL:-25}" "$WORK/$name.log"
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-12s rc=%-4s %5d.%01d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) | tee -a "$OUT/summary.txt"
  [ "$rc" -eq 0 ] || FAILED+=("$name")
  pack
}

{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; uname -r;
  $PY -c 'import sys, torch, numpy, pyarrow; print(sys.version.split()[0], "torch", torch.__version__,
"numpy", numpy.__version__, "pyarrow", pyarrow.__version__)'; nproc; } >"$WORK/machine.txt" 2>&1
cat "$WORK/machine.txt"

if [ -d "$WHEELS" ]; then
  step wheels 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
[ -n "${SKIP_INSTALL:-}" ] || step install 240 $PY -m pip install -q --no-build-isolation --no-deps .
# everything else runs outside the checkout: `python -m counterprof` there would import the
# source tree's counterprof (no collectors subpackage: setup maps collectors/ into it)
REPO=$(pwd)
cd "$WORK"
step list 60 $PY -m counterprof list
# quick ceilings first (the jobs' runs copy them into meta.json for the roofline); the full
# calibration last, where a run cut short loses only it
step calibrate_q 90 $PY -m counterprof calibrate --quick --no-collectives
TAIL=60 COUNTERPROF_REQUIRE_GPU=1 COUNTERPROF_CI=1 step pytest 330 $PY -m pytest -s -p no:cacheprovider \
  --timeout 900 "$REPO/${GPU_TESTS:-tests/gpu}"
step roofline 60 $PY -m counterprof roofline "$WORK/jobs/gpt2_train/run"
step nvml_tick 60 $PY "$REPO/benchmarks/nvml_tick.py" --only tick --real --quick --json "$WORK/nvml_tick.json"
[ -z "${FULL_CALIBRATE:-}" ] || step calibrate 180 $PY -m counterprof calibrate --no-collectives
cp -r "${XDG_CACHE_HOME:-$HOME/.cache}/counterprof/ceilings" "$WORK/ceilings" 2>/dev/null

tar czf "$OUT/runs.tgz" -C "$WORK" jobs 2>/dev/null
[ "$(stat -c %s "$OUT/runs.tgz" 2>/dev/null || echo 0)" -gt 16000000 ] && \
  tar czf "$OUT/runs.tgz" -C "$WORK" --exclude='jobs/*/run/_ranks/*/traces' jobs
pack
echo "=== steps"; cat "$OUT/summary.txt"
if [ "${#FAILED[@]}" -gt 0 ]; then
  echo "FAILED steps: ${FAILED[*]}" | tee -a "$OUT/summary.txt"
  exit 1
fi
