#!/usr/bin/env bash
# Sets up .venv and runs the main job on the built-in BERT-base model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/autofusion info bert-base
exec .venv/bin/autofusion run bert-base --seq 128
