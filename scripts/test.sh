#!/usr/bin/env bash
# Sets up .venv (see setup.sh) and runs the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1  # Triton kernels run on the CPU interpreter: no GPU needed
exec .venv/bin/python -m pytest -q "$@"
