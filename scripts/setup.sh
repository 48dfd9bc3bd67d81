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
# A large wheel (triton, 286 MB) cut off mid-download failed a fresh set-up once: pip resumes an
# interrupted download many times over, and each install is tried again before giving up.
PIP_FLAGS=(--quiet --retries 10 --timeout 60)
pip_install() {
    local attempt
    for attempt in 1 2 3; do
        if .venv/bin/python -m pip install "${PIP_FLAGS[@]}" "$@"; then
            return 0
        fi
        echo "setup: pip install $* failed (attempt $attempt of 3)" >&2
        sleep $((attempt * 10))
    done
    return 1
}
pip_install --upgrade pip
PIP_FLAGS+=(--resume-retries 50)  # the upgraded pip (>= 25.1) takes it
# torch first, pinned: this exact version is the CPU build; any other request pulls a CUDA build of
# several GB. Without it (AUTOFUSION_NO_TORCH=1) the torch and Triton tests skip and say why.
if [ -z "${AUTOFUSION_NO_TORCH:-}" ]; then
    pip_install "torch==2.13.0"
    pip_install -e ".[test,gpu,cluster]"
else
    pip_install -e ".[test,cluster]"
fi
