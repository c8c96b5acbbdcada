#!/usr/bin/env bash
# The pure-Python wheels the stock GPU image (torch 2.11, triton 3.6, transformers 5.17) lacks and
# bench/gpu_check.sh needs, built into .whl/ (gitignored) to carry to the GPU machine; under 64 MiB.
#
#   bash bench/fetch_gpu_wheels.sh      # here, with network; then carry .whl with the work tree
#
# liger-kernel: timed by the kernel benchmark. omegaconf (+ antlr4, an sdist built into a wheel
# here so the offline install needs no build step): the configs of bench/gpu_train_step.py. peft and
# accelerate (this environment's versions): its LoRA step (--lora-rank).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
mkdir -p .whl
"$PY" -m pip wheel -q --no-deps -w .whl liger-kernel "omegaconf>=2.3" "antlr4-python3-runtime==4.9.3" \
  "peft==$("$PY" -c 'import peft; print(peft.__version__)')" "accelerate==$("$PY" -c 'import accelerate; print(accelerate.__version__)')"
size=$(du -sm .whl | cut -f1)
ls -1 .whl
echo "INFO .whl holds ${size} MiB"
[ "$size" -lt 64 ] || { echo "FAIL .whl is ${size} MiB, over the 64 MiB a device run carries"; exit 1; }
