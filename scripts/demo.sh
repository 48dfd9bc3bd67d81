#!/usr/bin/env bash
# Sets up .venv, then the main job on the built-in BERT-base model: fuse it with the shipped rules
# and run the fused model as one compiled SuperKernel.
set -euo pipefail
cd "$(dirname "$0")/.."
AUTOFUSION_NO_TORCH=1 bash scripts/setup.sh  # the main job needs no torch
.venv/bin/autofusion fuse bert-base --seq 128
exec .venv/bin/autofusion run bert-base --seq 128 --backend c
