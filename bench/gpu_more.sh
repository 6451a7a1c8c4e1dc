#!/usr/bin/env bash
# The GPU check's companion (docs/gpu-check.md): on the same kind of machine (one NVIDIA GPU, no network, the
# .wheels/ of make gpu-wheels carried with the tree), what the GPU check does not cover yet:
#
#     bash bench/gpu_more.sh OUT
#
# 1. sbench preflight on the local inventory: the device's bf16 matmul TFLOP/s and memory copy GB/s, recorded in
#    the preflight table (and the measured_peaks view);
# 2. a LoRA point of the 1.1B model with runner.profile (steps 10-12 of rank 0; 40 steps a run): one measured
#    repeat and one profiled, collected; sbench profile prints where the profiled steps' time went (CUDA kernels included, and
#    the communication phases: nothing exposed on one device);
# 3. full fine-tuning with distributed_backend FSDP on one rank, without and with gradient checkpointing: what
#    each ran (the backend asked, the distributed type and processes its rank 0 recorded), and the memory
#    prediction (harness.spec.memory, checkpointing's smaller activations included) against the CUDA allocator's
#    peak, with the error.
# Everything goes to OUT: more.log, results.duckdb, preflight.json, profile.txt, fsdp.json.
# A rehearsal on a CPU (make test runs it): SBENCH_GPU_MORE_SIZE=tiny SBENCH_GPU_MORE_DEVICE=cpu
# SBENCH_GPU_SKIP_WHEELS=1 SBENCH_GPU_MORE_SECONDS=3 with the checkout's environment's python as SBENCH_GPU_PYTHON.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?name the output folder}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="${SBENCH_GPU_WORK:-${TMPDIR:-/tmp}/sbench-gpu-more}"
mkdir -p "$WORK"
exec > >(tee "$OUT/more.log") 2>&1
PY="${SBENCH_GPU_PYTHON:-$(command -v python3)}"
START=$(date +%s)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
  DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
unset SBENCH_INVENTORY SBENCH_DB SBENCH_WORKDIR SBENCH_FAULT SBENCH_SAMPLER_BACKEND SBENCH_FAKE_GPUS
SITE="$WORK/site"
if [[ "${SBENCH_GPU_SKIP_WHEELS:-0}" != 1 ]]; then
  rm -rf "$SITE"
  "$PY" "$ROOT/bench/gpu_wheels.py" install --wheels "$ROOT/.wheels" --target "$SITE" > "$WORK/wheels.json"
fi
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
DB="$OUT/results.duckdb"
RUNS="$WORK/runs"
sb() { echo "[$(( $(date +%s) - START )) s] \$ sbench $*" >&2; (cd "$ROOT" && "$PY" -m harness "$@"); }

rc_pf=0
sb preflight --seconds 1 --workdir "$RUNS" --db "$DB" --json > "$OUT/preflight.json" || rc_pf=$?
cat "$OUT/preflight.json"
echo "preflight exit $rc_pf"

MODEL="${SBENCH_GPU_MORE_MODEL:-$WORK/model-${SBENCH_GPU_MORE_SIZE:-1b}}"  # an existing one is kept (--if-missing)
sb model tiny --size "${SBENCH_GPU_MORE_SIZE:-1b}" --device "${SBENCH_GPU_MORE_DEVICE:-cuda}" -o "$MODEL" --if-missing
DSID="${SBENCH_GPU_MORE_DATASET:-news-chars-2048-entries-4096}"
SEQ="${SBENCH_GPU_MORE_SEQ:-768}"
SECS="${SBENCH_GPU_MORE_SECONDS:-15}"
# the profiled point stops at a step count, not a time: its profiled steps (10-12) are reached however slow a step is
PSTEPS="${SBENCH_GPU_MORE_PROFILE_STEPS:-40}"
BATCH="${SBENCH_GPU_MORE_BATCH:-8}"
DATA="$WORK/data"
mkdir -p "$DATA" "$WORK/gen"
[[ -f "$WORK/gen/$DSID.jsonl" ]] || sb dataset generate "$DSID" -o "$WORK/gen/$DSID.jsonl" --entries 512
cp "$WORK/gen/$DSID.jsonl" "$DATA/$DSID.jsonl"  # without its .meta.json: an external file, used as is
cat > "$WORK/profile.yaml" <<EOF
campaign: gpu-more-profile
experiment: finetune_lora_benchmark-v1.0.0
description: sbench on a GPU, a LoRA point with runner.profile
entity: {model_name: tinyllama-1b-gpu, model_max_length: $SEQ, dataset_id: $DSID,
         number_gpus: 1, torch_dtype: bfloat16, bf16: true, gradient_checkpointing: false,
         gradient_accumulation_steps: 1, max_steps: $PSTEPS, batch_size: $BATCH}
model_map: {tinyllama-1b-gpu: $MODEL}
data_dir: $DATA
runner: {sample_interval_s: 0.5, profile: {steps: [10, 12], ranks: [0]}}
EOF
sb submit "$WORK/profile.yaml" --executor local --wait --workdir "$RUNS" --db "$DB"
sb collect --workdir "$RUNS" --db "$DB"
sb query --db "$DB" "select run_id, r.profiled, outcome, round(dataset_tokens_per_second) as tok_s from runs r join measurements using (run_id) order by run_id"
RUN=$(cd "$ROOT" && "$PY" -m harness query --db "$DB" --format json "select run_id from runs where profiled" \
      | "$PY" -c 'import json, sys; print(json.load(sys.stdin)[0]["run_id"])')
sb profile "$RUN" --db "$DB" | tee "$OUT/profile.txt"

cat > "$WORK/fsdp.yaml" <<EOF
campaign: gpu-more-fsdp
experiment: finetune_full_benchmark-v1.0.0
description: sbench on a GPU, full fine-tuning under FSDP on one rank, without and with gradient checkpointing
entity: {model_name: tinyllama-1b-gpu, model_max_length: $SEQ, dataset_id: $DSID,
         number_gpus: 1, distributed_backend: FSDP, torch_dtype: bfloat16, bf16: true,
         gradient_accumulation_steps: 1, max_steps: 1000000, stop_after_seconds: $SECS, batch_size: $BATCH}
grid: {gradient_checkpointing: [false, true]}
model_map: {tinyllama-1b-gpu: $MODEL}
data_dir: $DATA
runner: {sample_interval_s: 0.5}
EOF
rc_fsdp=0
sb submit "$WORK/fsdp.yaml" --executor local --wait --workdir "$RUNS" --db "$DB" || rc_fsdp=$?
echo "fsdp submit exit $rc_fsdp"
sb collect --workdir "$RUNS" --db "$DB"
sb query --db "$DB" --format json "select p.gradient_checkpointing, p.notes, r.outcome, r.reason, r.job_dir,
  m.predicted_total_bytes, m.memory_peak_bytes, m.predicted_activation_bytes, m.activation_bytes,
  round(m.dataset_tokens_per_second) as tok_s from runs r join points p using (point_id)
  left join measurements m using (run_id) where r.campaign = 'gpu-more-fsdp' order by p.gradient_checkpointing" \
  > "$WORK/fsdp-rows.json"
"$PY" "$ROOT/bench/gpu_more_fsdp.py" "$WORK/fsdp-rows.json" "$OUT/fsdp.json"
echo "gpu_more.sh: done after $(( $(date +%s) - START )) s"
