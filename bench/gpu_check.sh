#!/usr/bin/env bash
# One-command GPU check of mopd.kernels (DESIGN §7, §8): compiled Triton kernels against the naive
# references, then timings against the matmul floor, the chunked torch path and Liger, on one H200
# (stock image: torch 2.11, triton 3.6; nothing to install). Sized for under 8 minutes (not yet run
# on a GPU); a 470 s timeout stops it regardless.
#
#   bash bench/gpu_check.sh              # on the GPU machine; prints PASS/FAIL lines
#   bash bench/gpu_check.sh --dry-run    # CPU self-check with the Triton interpreter (tests run this)
#   bash bench/gpu_check.sh --skip-timing | --strict | --shape T,H,V   (passed to bench/gpu_kernels.py)
#
# With $OUT set, the JSON summary goes to $OUT/kernels_gpu.json and the log to $OUT/kernels_gpu.log.
# Liger's fused linear cross entropy is timed when liger_kernel imports, or when a wheel was carried
# in .whl/ (here: `pip download --no-deps -d .whl liger-kernel`, then carry .whl).
# Python: $PYTHON if set, else python3 (the GPU image's, with CUDA torch); .venv/bin/python for --dry-run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

dry=0
for a in "$@"; do [ "$a" = "--dry-run" ] && dry=1; done
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ "$dry" = 1 ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
if [ "$dry" = 0 ] && ! "$PY" -c 'import liger_kernel' 2>/dev/null; then
  for whl in .whl/liger_kernel-*.whl; do
    [ -f "$whl" ] && "$PY" -m pip install -q --no-deps --no-index "$whl" && echo "INFO installed $whl"
  done
fi

out_args=()
log=/dev/null
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  out_args=(--out "$OUT/kernels_gpu.json")
  log="$OUT/kernels_gpu.log"
fi

# 360 s for the kernels plus 90 s for the training step leave the 8-minute budget some slack.
timeout 360 "$PY" bench/gpu_kernels.py "${out_args[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 124 ]; then
  echo "FAIL gpu_check: kernels timed out after 360 s"
fi

# One training step of a small Qwen3-architecture model with the HF engine (DESIGN §7, trainer issue).
step_args=()
[ "$dry" = 1 ] && step_args+=(--dry-run)
[ -n "${OUT:-}" ] && step_args+=(--out "$OUT/train_step.json")
timeout 90 "$PY" bench/gpu_train_step.py "${step_args[@]}" 2>&1 | tee -a "$log"
step_rc=${PIPESTATUS[0]}
[ "$step_rc" = 124 ] && echo "FAIL gpu_check: training step timed out after 90 s"
[ "$rc" = 0 ] && rc=$step_rc
exit "$rc"
