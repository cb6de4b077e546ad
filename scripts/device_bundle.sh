#!/usr/bin/env bash
# Prepares what the GPU lane's machine cannot fetch (it has no network): downloads, into the git-ignored .device/,
# every wheel scripts/device_manifest.txt marks `bundle==VERSION`:
#   .device/wheels/  for the device: cp312, manylinux x86_64 (python 3.12 there);
#   .device/host/    for this machine's python, used by `scripts/device_check.sh --cpu-dry-run` only (not carried);
# and the step benchmark's peers (rows `peer==VERSION` and `git==TAG`), for both machines:
#   .device/peers/torchtitan/    the pure-Python wheels unpacked into one folder (benchmarks/peer_torchtitan.py);
#   .device/peers/torchao/       torchao's abi3 wheel unpacked (the float8 rows of benchmarks/step.py);
#   .device/peers/megatron-lm/   Megatron-LM's trainer from a git archive of the tag (benchmarks/peer_megatron_lm.py),
#                                from the bare clone $MEGATRON_LM_REPO (default /work/.mirror/NVIDIA+Megatron-LM/repo).
# Then measures what would travel (tracked + untracked-not-ignored files + .device/wheels, limit 64 MiB), and prints
# the path to carry and the device command. Needs: pip with access to a package index (here, not on the device).
#
#   bash scripts/device_bundle.sh            # then, on the device: bash scripts/device_check.sh [--quick]
#   bash scripts/device_bundle.sh --list     # the requirements it would download, one a line; downloads nothing
#   DEVICE_PYTHON_VERSION=3.12 DEVICE_PLATFORMS="manylinux_2_28_x86_64 ..." bash scripts/device_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEVICE_PYTHON_VERSION=${DEVICE_PYTHON_VERSION:-3.12}
# pip matches manylinux_2_N exactly: the tags a wheel for glibc 2.17..2.39 can carry
DEVICE_PLATFORMS=${DEVICE_PLATFORMS:-"manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 linux_x86_64 any"}
LIMIT=$((64 * 1024 * 1024))
WHEELS=.device/wheels
HOST=.device/host
PEERS=.device/peers
MEGATRON_LM_REPO=${MEGATRON_LM_REPO:-/work/.mirror/NVIDIA+Megatron-LM/repo}

mapfile -t BUNDLE < <(grep -v '^#' scripts/device_manifest.txt | awk -F' *[|] *' '$3 ~ /^bundle==/ {sub("bundle==", "", $3); print $1 "==" $3}')
mapfile -t PEER_REQS < <(grep -v '^#' scripts/device_manifest.txt | awk -F' *[|] *' '$3 ~ /^peer==/ {sub("peer==", "", $3); print $1 "==" $3}')
MLM_TAG=$(grep -v '^#' scripts/device_manifest.txt | awk -F' *[|] *' '$1 == "megatron-lm" && $3 ~ /^git==/ {sub("git==", "", $3); print $3}')
if [[ ${#BUNDLE[@]} -eq 0 ]]; then
  echo "device_bundle: scripts/device_manifest.txt names no bundle==VERSION package" >&2
  exit 1
fi
if [[ "${1:-}" == --list ]]; then
  printf '%s\n' "${BUNDLE[@]}" "${PEER_REQS[@]}"
  [[ -n "$MLM_TAG" ]] && echo "megatron-lm@$MLM_TAG"
  exit 0
elif [[ $# -gt 0 ]]; then
  echo "device_bundle: unknown argument '$1' (the only one is --list)" >&2
  exit 2
fi
platform_args=()
for p in $DEVICE_PLATFORMS; do platform_args+=(--platform "$p"); done

rm -rf "$WHEELS" "$HOST"
mkdir -p "$WHEELS" "$HOST"
for req in "${BUNDLE[@]}"; do
  echo "[bundle] $req for the device (cp${DEVICE_PYTHON_VERSION/./}, manylinux x86_64) -> $WHEELS"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON_VERSION" \
    --implementation cp "${platform_args[@]}" -d "$WHEELS" "$req"
  echo "[bundle] $req for this machine ($("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")'), for --cpu-dry-run) -> $HOST"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$HOST" "$req"
done
(cd "$WHEELS" && sha256sum ./*.whl > SHA256SUMS)
(cd "$HOST" && sha256sum ./*.whl > SHA256SUMS)

rm -rf "$PEERS"
mkdir -p "$PEERS/torchtitan" "$PEERS/torchao" "$PEERS/.wheels"
for req in "${PEER_REQS[@]}"; do
  dest=torchtitan; [[ "$req" == torchao==* ]] && dest=torchao
  echo "[bundle] $req (for the device's cp312, abi3 or pure Python) -> $PEERS/$dest"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON_VERSION" \
    --implementation cp "${platform_args[@]}" -d "$PEERS/.wheels/$dest" "$req"
done
for dest in torchtitan torchao; do
  for w in "$PEERS/.wheels/$dest"/*.whl; do "$PY" -m zipfile -e "$w" "$PEERS/$dest"; done
done
rm -rf "$PEERS/.wheels"
if [[ -n "$MLM_TAG" ]]; then
  echo "[bundle] Megatron-LM $MLM_TAG's trainer (git archive of $MEGATRON_LM_REPO, megatron/core removed) -> $PEERS/megatron-lm"
  "$PY" - "$MEGATRON_LM_REPO" "$PEERS/megatron-lm" "$MLM_TAG" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
import megatron_lm_host
if megatron_lm_host.TAG != sys.argv[3]:
    sys.exit(f"device_bundle: scripts/megatron_lm_host.py runs {megatron_lm_host.TAG}, the manifest names {sys.argv[3]}")
megatron_lm_host.extract_megatron_lm(sys.argv[1], Path(sys.argv[2]), only_trainer=True)
PY
fi

tree_bytes=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
bundle_bytes=$(du -cb "$WHEELS" "$PEERS" | awk 'END {print $1}')
total=$((tree_bytes + bundle_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "[bundle] wheels for the device:"
ls -l "$WHEELS"/*.whl | awk '{print "  " $NF " (" $5 " bytes)"}'
echo "[bundle] peers: $(du -sh "$PEERS"/* | awk '{print $2 " " $1}' | paste -sd ';' -)"
echo "[bundle] what travels: working tree $(mib "$tree_bytes") + $WHEELS and $PEERS $(mib "$bundle_bytes") = $(mib "$total") (limit 64 MiB)"
if (( total > LIMIT )); then
  echo "device_bundle: $(mib "$total") is over the 64 MiB that may travel" >&2
  exit 1
fi
cat <<MSG
[bundle] ready. On the device (offline), from the repository root, carrying $WHEELS and $PEERS:
  carry:   $WHEELS $PEERS
  command: bash scripts/device_check.sh            # full, under 8 minutes; --quick: under 4
  (the report lands in \$OUT when set, else ./device-report; --print-plan shows what would run)
  here, offline:  PIP_NO_INDEX=1 https_proxy=http://127.0.0.1:9 http_proxy=http://127.0.0.1:9 bash scripts/device_check.sh --cpu-dry-run
MSG
