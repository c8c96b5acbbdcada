#!/usr/bin/env bash
# One-command GPU check (docs/architecture.md, "Performance targets"; §8) on one H200 (stock image: torch 2.11, triton 3.6,
# transformers 5.17; no vllm, flash-attn, omegaconf): (1) mopd_kernels' compiled Triton kernels
# against the naive references, then timed against the matmul floor, the chunked torch path and
# Liger; (2) one trainer step of a small Qwen3 model with the HF engine (bench/gpu_train_step.py);
# (3) the GPU training path through FSDP2 at world size 1 (bench/gpu_fsdp_step.py: fp32 masters and
# bf16 compute, the teacher, the colocation cycle with streamed weights, a checkpoint save/load, and
# where vLLM imports: a vLLM rollout, one VLLMStepFront round trip, and one sleep / wake / load /
# generate cycle whose greedy output is scored against the trainer's model), tokens/s per phase.
# Install vLLM 0.32 (the gpu extra's version) on the GPU machine for (3) to drive it; the same
# script runs on vLLM's CPU build with --dry-run in .venv-vllm. (4) packed attention without flash-attn
# (bench/gpu_attention.py: torch's varlen_attn against flash-attn and padded SDPA). (5) the trainer
# step of (2) with LoRA adapters of rank 16 (--lora-rank 16; peft carried in .whl). Sized for under 9
# minutes (265 + 25 + 70 + 60 + 110 s caps; not yet run on a GPU).
#
#   bash bench/gpu_check.sh              # on the GPU machine; prints PASS/FAIL lines
#   bash bench/gpu_check.sh --dry-run    # CPU self-check with the Triton interpreter (tests run this)
#   bash bench/gpu_check.sh --skip-timing | --strict | --shape T,H,V   (passed to bench/gpu_kernels.py)
#
# With $OUT set, the JSON summary goes to $OUT/kernels_gpu.json and the log to $OUT/kernels_gpu.log.
# Wheels the image lacks (liger-kernel, omegaconf, peft and accelerate) are installed offline from .whl/ when carried
# (build it here with `bash bench/fetch_gpu_wheels.sh`, 2 MiB, then carry .whl).
# Python: $PYTHON if set, else python3 (the GPU image's, with CUDA torch); .venv/bin/python for --dry-run.
set -uo pipefail
cd "$(dirname "$0")/.."
# mopd and mopd_kernels from this checkout (the GPU image has neither installed)
export PYTHONPATH="$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}"

dry=0
for a in "$@"; do [ "$a" = "--dry-run" ] && dry=1; done
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ "$dry" = 1 ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
if [ "$dry" = 0 ]; then
  for pair in liger_kernel:liger_kernel omegaconf:omegaconf antlr4:antlr4_python3_runtime accelerate:accelerate \
              peft:peft; do
    mod="${pair%%:*}"; stem="${pair##*:}"
    "$PY" -c "import $mod" 2>/dev/null && continue
    for whl in .whl/"$stem"-*.whl; do
      [ -f "$whl" ] && "$PY" -m pip install -q --no-deps --no-index "$whl" && echo "INFO installed $whl"
    done
  done
fi

out_args=()
log=/dev/null
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  out_args=(--out "$OUT/kernels_gpu.json")
  log="$OUT/kernels_gpu.log"
fi

# 265 s for the kernels, 25 s for packed attention, 70 s for the trainer step, 60 s for its LoRA
# variant, 110 s for the FSDP2 path: 530 s of 540.
timeout 265 "$PY" bench/gpu_kernels.py "${out_args[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 124 ]; then
  echo "FAIL gpu_check: kernels timed out after 265 s"
fi

# Packed attention without flash-attn: torch's varlen_attn against flash-attn (when
# installed) and the padded SDPA batch on a 16k-token row of mixed calls; auto's choice. The CPU
# dry run (a pure-torch stand-in for the kernel) gets a loaded box's 120 s.
att_args=()
att_cap=25
[ "$dry" = 1 ] && att_args+=(--dry-run) && att_cap=120
[ -n "${OUT:-}" ] && att_args+=(--out "$OUT/attention_gpu.json")
timeout "$att_cap" "$PY" bench/gpu_attention.py "${att_args[@]}" 2>&1 | tee -a "$log"
att_rc=${PIPESTATUS[0]}
[ "$att_rc" = 124 ] && echo "FAIL gpu_check: packed attention timed out after $att_cap s"
[ "$rc" = 0 ] && rc=$att_rc

# One training step of a small Qwen3-architecture model with the HF engine (docs/architecture.md, "Performance targets"; trainer issue).
step_args=()
[ "$dry" = 1 ] && step_args+=(--dry-run)
[ -n "${OUT:-}" ] && step_args+=(--out "$OUT/train_step.json")
timeout 70 "$PY" bench/gpu_train_step.py "${step_args[@]}" 2>&1 | tee -a "$log"
step_rc=${PIPESTATUS[0]}
[ "$step_rc" = 124 ] && echo "FAIL gpu_check: training step timed out after 70 s"
[ "$rc" = 0 ] && rc=$step_rc

# The same step with LoRA adapters of rank 16 (issue 52): the base frozen, adapters and their AdamW
# alone in fp32; its step time and peak memory beside the full step's. Needs peft (carried in .whl).
lora_args=(--lora-rank 16)
[ "$dry" = 1 ] && lora_args+=(--dry-run)
[ -n "${OUT:-}" ] && lora_args+=(--out "$OUT/train_step_lora.json")
timeout 60 "$PY" bench/gpu_train_step.py "${lora_args[@]}" 2>&1 | tee -a "$log"
lora_rc=${PIPESTATUS[0]}
[ "$lora_rc" = 124 ] && echo "FAIL gpu_check: LoRA training step timed out after 60 s"
[ "$rc" = 0 ] && rc=$lora_rc

# The FSDP2 training path at world size 1, the teacher, the colocation cycle, checkpoints.
fsdp_args=()
[ "$dry" = 1 ] && fsdp_args+=(--dry-run)
[ -n "${OUT:-}" ] && fsdp_args+=(--out "$OUT/fsdp_step.json")
timeout 110 "$PY" bench/gpu_fsdp_step.py "${fsdp_args[@]}" 2>&1 | tee -a "$log"
fsdp_rc=${PIPESTATUS[0]}
[ "$fsdp_rc" = 124 ] && echo "FAIL gpu_check: FSDP2 path timed out after 110 s"
[ "$rc" = 0 ] && rc=$fsdp_rc
exit "$rc"
