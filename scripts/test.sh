#!/usr/bin/env bash
# The test suite as CI runs it: install, then every CPU test (GPU-marked tests are run by
# scripts/gpu_conformance.sh on a machine with a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m pytest -q -m "not gpu" -p no:cacheprovider --durations=40 "$@"
