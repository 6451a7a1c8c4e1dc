#!/usr/bin/env bash
# sbench's GPU check (docs/gpu-check.md): on a machine with one NVIDIA GPU and no network,
#
#     bash bench/gpu_check.sh OUT             # OUT: where gpu_check.json, results.duckdb and the logs go
#     bash bench/gpu_check.sh --rehearse OUT  # the same on this machine's CPU, with the tiny model
#
# 1. installs what the machine's python lacks from .wheels/ (make gpu-wheels; carried with the tree) into a
#    folder of the scratch dir, first on PYTHONPATH (bench/gpu_wheels.py; nothing else of the machine changes);
# 2. runs bench/gpu_check.py from this checkout, offline: model, dataset, the campaigns, collect, the checks.
# Exit status: 0 every check holds, 1 a check failed (named at the end) or the run broke, 2 bad arguments.
# Scratch (model, dataset, job dirs): $SBENCH_GPU_WORK, else $TMPDIR/sbench-gpu-check-<mode>.
# On a GPU no campaign starts that would end after $SBENCH_GPU_DEADLINE_S (default 450) seconds, and one still
# running then is cancelled: what ran is collected and checked, within a lent machine's time limit.
set -euo pipefail

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REHEARSE=0
OUT=""
for arg in "$@"; do
  case "$arg" in
    --rehearse) REHEARSE=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $arg" >&2; usage >&2; exit 2 ;;
    *) if [[ -n "$OUT" ]]; then echo "gpu_check.sh: one output folder, got $OUT and $arg" >&2; exit 2; fi
       OUT="$arg" ;;
  esac
done
if [[ -z "$OUT" ]]; then
  echo "gpu_check.sh: name the output folder, e.g. bash bench/gpu_check.sh \"\$OUT\"" >&2
  exit 2
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
MODE=gpu
[[ $REHEARSE == 1 ]] && MODE=rehearse
WORK="${SBENCH_GPU_WORK:-${TMPDIR:-/tmp}/sbench-gpu-check-$MODE}"
mkdir -p "$WORK"

# Everything below goes to the terminal and to OUT/gpu_check.log.
exec > >(tee "$OUT/gpu_check.log") 2>&1
TEE_PID=$!
# On exit, let tee write the last lines to the log before the shell is gone.
trap 'exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null || true' EXIT
START=$(date +%s)

# The interpreter: the machine's python3 (on a lent machine), or this checkout's environment when rehearsing.
if [[ -n "${SBENCH_GPU_PYTHON:-}" ]]; then
  PY="$SBENCH_GPU_PYTHON"
elif [[ $REHEARSE == 1 && -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  PY="$(command -v python3)"
fi
echo "gpu_check.sh: $MODE, python $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])')), out $OUT, work $WORK"

# No hub, no telemetry: every model and dataset is made here.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
  DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
# The local inventory (NVML's GPUs), this check's own database and work dir: nothing of the caller's sbench set-up.
unset SBENCH_INVENTORY SBENCH_DB SBENCH_WORKDIR SBENCH_FAULT SBENCH_SAMPLER_BACKEND SBENCH_FAKE_GPUS

SITE="$WORK/site"
if [[ $REHEARSE == 1 ]]; then
  # This machine's environment has every dependency: what the lent machine would get is checked, not installed
  # (its wheels are for CPython 3.12; this python may be another).
  if [[ -d "$ROOT/.wheels" ]]; then
    "$PY" "$ROOT/bench/gpu_wheels.py" check --wheels "$ROOT/.wheels" || {
      echo "gpu_check.sh: .wheels/ would not serve the GPU machine (above); make gpu-wheels rebuilds it" >&2; exit 1; }
  else
    echo "gpu_check.sh: rehearsal: no .wheels/ here (make gpu-wheels makes it); the wheel check is skipped"
  fi
  "$PY" "$ROOT/bench/gpu_wheels.py" install --wheels "$ROOT/.wheels" --target "$SITE" --dry-run \
    > "$OUT/wheels.json" || { cat "$OUT/wheels.json"; exit 1; }
  echo "gpu_check.sh: rehearsal: this python lacks nothing sbench needs ($OUT/wheels.json); nothing installed"
else
  if [[ ! -d "$ROOT/.wheels" ]]; then
    echo "gpu_check.sh: no .wheels/ in $ROOT: run make gpu-wheels where there is network, and carry .wheels" >&2
  fi
  rm -rf "$SITE"
  "$PY" "$ROOT/bench/gpu_wheels.py" install --wheels "$ROOT/.wheels" --target "$SITE" > "$OUT/wheels.json" || {
    cat "$OUT/wheels.json"; echo "gpu_check.sh: the machine lacks what sbench needs (above)" >&2; exit 1; }
  echo "gpu_check.sh: installed into $SITE: $("$PY" -c 'import json, sys; print(", ".join(f"{k} {v}" for k, v in json.load(open(sys.argv[1]))["install"].items()) or "nothing")' "$OUT/wheels.json")"
fi
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu_check.sh: wheels step done after $(( $(date +%s) - START )) s"

ARGS=(--out "$OUT" --work "$WORK")
if [[ $REHEARSE == 1 ]]; then
  ARGS+=(--rehearse)
else
  ARGS+=(--deadline-s "$(( ${SBENCH_GPU_DEADLINE_S:-450} - ($(date +%s) - START) ))")
fi
set +e
"$PY" "$ROOT/bench/gpu_check.py" "${ARGS[@]}"
RC=$?
set -e
echo "gpu_check.sh: exit $RC after $(( $(date +%s) - START )) s"
exit $RC
