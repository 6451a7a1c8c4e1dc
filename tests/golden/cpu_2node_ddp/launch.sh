#!/usr/bin/env bash
# sbench <VERSION>: runs once per node. campaign golden-cpu-2node-ddp, point ea1fdd8a57437cf2, attempt 1
set -euo pipefail
JOB_DIR=<OUT>/ea1fdd8a57437cf2.r0.a1
PARTITION=cpu
KNOWN_HOSTS='node1 node2'
# Keyed by the SLURM node name: namespaced or containerised nodes may share one hostname.
HOST="${SLURMD_NODENAME:-${SBENCH_HOST:-$(hostname -s)}}"
ENV_FILE="$JOB_DIR/env/$HOST.sh"
if [[ ! -f "$ENV_FILE" ]]; then
  echo "sbench: host $HOST is not a host of partition $PARTITION (known: $KNOWN_HOSTS); add it to the inventory" >&2
  exit 3
fi
# shellcheck source=/dev/null
source "$ENV_FILE"
MACHINE_RANK="${SLURM_NODEID:-0}"
if [[ -n "${SLURM_JOB_NODELIST:-}" ]] && command -v scontrol >/dev/null 2>&1; then
  MAIN_HOST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"
else
  MAIN_HOST="$HOST"
fi
case "$MAIN_HOST" in
node1) MAIN_IP=198.18.0.11 ;;
node2) MAIN_IP=198.18.0.12 ;;
*) MAIN_IP="$(getent hosts "$MAIN_HOST" | awk '{print $1; exit}' || true)" ;;
esac
MAIN_IP="${MAIN_IP:-127.0.0.1}"
# The rendezvous port follows the SLURM job id, so concurrent jobs on one head node do not collide.
PORT=28991
if [[ -n "${SBENCH_MAIN_PORT:-}" ]]; then
  PORT="$SBENCH_MAIN_PORT"
elif [[ -n "${SLURM_JOB_ID:-}" ]]; then
  PORT=$(( 20000 + SLURM_JOB_ID % 12000 ))
fi
export SBENCH_HOST="$HOST" SBENCH_MACHINE_RANK="$MACHINE_RANK" SBENCH_MAIN_IP="$MAIN_IP" SBENCH_MAIN_PORT="$PORT"
PY=<PYTHON>
# gloo and NCCL's bootstrap bind to the interface that holds this host's inventory address unless the
# inventory sets them: the hostname may resolve to a loopback address (127.0.1.1 on Debian/Ubuntu).
if [[ -n "${SBENCH_HOST_ADDRESS:-}" && ( -z "${GLOO_SOCKET_IFNAME:-}" || -z "${NCCL_SOCKET_IFNAME:-}" ) ]]; then
  IFACE="$("$PY" -m harness.runner.netif "$SBENCH_HOST_ADDRESS" 2>/dev/null || true)"
  if [[ -n "$IFACE" ]]; then
    export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$IFACE}" NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$IFACE}"
  else
    echo "sbench: warning: no interface of $HOST holds its inventory address $SBENCH_HOST_ADDRESS; gloo and NCCL pick one themselves (set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME in the inventory)" >&2
  fi
fi
exec "$PY" -m harness.runner node --job-dir "$JOB_DIR" --host "$HOST" -- \
  "$PY" -m accelerate.commands.launch --config_file "$JOB_DIR/accelerate.yaml" \
    --num_processes 4 --num_machines 2 --machine_rank "$MACHINE_RANK" \
    --main_process_ip "$MAIN_IP" --main_process_port "$PORT" \
    -m harness.runner.train \
    --model_name_or_path /models/llama3-8b \
    --torch_dtype bfloat16 \
    --use_flash_attn True \
    --training_data_path /data/sbench/news-tokens-16384plus-entries-4096.jsonl \
    --response_template '\n### Response:' \
    --dataset_text_field output \
    --log_level debug \
    --num_train_epochs 1 \
    --max_steps -1 \
    --per_device_train_batch_size 1 \
    --max_seq_length 512 \
    --eval_strategy no \
    --output_dir <OUT>/ea1fdd8a57437cf2.r0.a1/output \
    --gradient_accumulation_steps 4 \
    --save_strategy no \
    --learning_rate 1e-05 \
    --weight_decay 0.0 \
    --warmup_ratio 0.03 \
    --lr_scheduler_type cosine \
    --logging_steps 1 \
    --include_tokens_per_second True \
    --gradient_checkpointing True \
    --packing False \
    --peft_method lora \
    --target_modules q_proj k_proj \
    --r 4 \
    --lora_alpha 16 \
    --optim adamw_torch \
    --bf16 False \
    --gradient_checkpointing_kwargs '{"use_reentrant": false}' \
    --fast_moe 0 \
    --distributed_backend DDP \
    --fsdp_use_orig_params True \
    --stop_after_seconds -1 \
    --auto_stop_method None \
    --job_dir <OUT>/ea1fdd8a57437cf2.r0.a1
