#!/usr/bin/env bash
# Builds the peer environment .venv-peer (`make peer`): vLLM 0.33 for its CPU-side scheduler,
# prefix cache and block hashing, without CUDA. Steps:
#   1. a venv of the machine's python3;
#   2. benchmarks/peer/requirements.txt with --no-deps (torch's CPU build and the packages
#      vLLM's scheduler-side imports need, each pinned);
#   3. the vLLM wheel with --no-deps, from a cache directory so CI downloads its 336 MB once:
#      ${JUNCTION_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/junction-peer};
#   4. checks: torch is a CPU build, and the driver answers a ping through vLLM's imports.
# Any failure stops the build with a message; `make peer` then leaves no stamp.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=.venv-peer
VLLM_VERSION=0.33.0
CACHE="${JUNCTION_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/junction-peer}"
PIP_QUIET=(--quiet --disable-pip-version-check)

fail() { echo "make peer: $*" >&2; exit 1; }

command -v python3 >/dev/null || fail "python3 is not on PATH"
mkdir -p "$CACHE" || fail "cannot create the wheel cache $CACHE"

wheel=$(ls "$CACHE"/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "make peer: downloading the vLLM $VLLM_VERSION wheel into $CACHE (once)"
    python3 -m pip download "${PIP_QUIET[@]}" --no-deps --only-binary=:all: \
        "vllm==$VLLM_VERSION" -d "$CACHE" || fail "cannot download vllm==$VLLM_VERSION"
    wheel=$(ls "$CACHE"/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
    [ -n "$wheel" ] || fail "no vllm-$VLLM_VERSION wheel in $CACHE after the download"
fi

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" || fail "cannot create $VENV"
fi

"$VENV/bin/pip" install "${PIP_QUIET[@]}" --no-deps -r benchmarks/peer/requirements.txt \
    || fail "cannot install benchmarks/peer/requirements.txt"
"$VENV/bin/python" - <<'EOF' || fail "torch in $VENV is not a CPU build (pip took a CUDA wheel?)"
import sys

import torch

sys.exit(0 if torch.version.cuda is None else 1)
EOF

"$VENV/bin/pip" install "${PIP_QUIET[@]}" --no-deps "$wheel" || fail "cannot install $wheel"

answer=$(echo '{"cmd": "ping"}' | "$VENV/bin/python" benchmarks/peer/vllm_replay.py serve 2>/dev/null) \
    || fail "the peer driver does not start; run: echo '{\"cmd\": \"ping\"}' | $VENV/bin/python benchmarks/peer/vllm_replay.py serve"
case "$answer" in
    *"\"vllm\":\"$VLLM_VERSION\""*) echo "make peer: $VENV ready (vLLM $VLLM_VERSION, CPU torch)" ;;
    *) fail "unexpected answer from the peer driver: $answer" ;;
esac
