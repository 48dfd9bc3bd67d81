#!/usr/bin/env bash
# Sets up a virtual environment in .venv with autofusion, its test tools, Ray (the cluster extra,
# for fuzz campaigns) and the optional GPU extra
# (torch CPU build + triton, for the Triton backend under TRITON_INTERPRET=1). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first, pinned: this exact version is the CPU build; any other request pulls a CUDA build of
# several GB. Without it (AUTOFUSION_NO_TORCH=1) the torch and Triton tests skip and say why.
if [ -z "${AUTOFUSION_NO_TORCH:-}" ]; then
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
    .venv/bin/python -m pip install --quiet -e ".[test,gpu,cluster]"
else
    .venv/bin/python -m pip install --quiet -e ".[test,cluster]"
fi
