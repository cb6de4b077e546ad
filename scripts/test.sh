#!/usr/bin/env bash
# The test suite as CI runs it: install, then every CPU test (GPU-marked tests are run by
# scripts/gpu_conformance.sh on a machine with a GPU).
# Two pytest-xdist workers by default (MTMEGATRON_TEST_WORKERS=N to change, 0 for one process): most tests are one
# subprocess or one rank, so a single pytest process leaves a core idle. A file's tests stay on one worker
# (tests/conftest.py groups the tests that share a fixture), so module and directory fixtures still run once, and
# the costliest waiting group goes first (tests/helpers/xdist_schedule.py, from tests/durations.json: re-record it
# with MTMEGATRON_RECORD_DURATIONS=tests/durations.json bash scripts/test.sh). The run ends with each worker's load.
# With workers, torch runs one OpenMP thread per process unless OMP_NUM_THREADS is set: two workers with
# multi-rank runs share two cores (the packed-SFT module fixture: 51 s on one worker, 165 s on two without this,
# under 45 s with it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
WORKERS=${MTMEGATRON_TEST_WORKERS:-2}
XDIST=()
if [[ "$WORKERS" != 0 ]]; then
  XDIST=(-n "$WORKERS" --dist loadgroup)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
exec "${PYTHON:-python3}" -m pytest -q -m "not gpu" -p no:cacheprovider --durations=40 "${XDIST[@]}" "$@"
