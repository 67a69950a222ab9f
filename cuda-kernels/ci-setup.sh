#!/usr/bin/env bash
# Installs NVRTC 12.9 and ptxas from PyPI wheels into $REPO/.cuda-wheels (no
# CUDA toolkit needed) and prints the environment the CUDA tests need:
#
#   eval "$(bash cuda-kernels/ci-setup.sh)"
#
# Idempotent: an existing install of the pinned versions is kept. Progress
# goes to stderr, only `export` lines to stdout.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$REPO/.cuda-wheels"
STAMP="$DEST/.tessera-cuda-12.9.86"
if [ ! -f "$STAMP" ] || [ ! -f "$DEST/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
    echo "installing NVRTC/ptxas wheels into $DEST" >&2
    rm -rf "$DEST"
    python3 -m pip install --quiet --no-cache-dir --disable-pip-version-check --root-user-action=ignore --target "$DEST" \
        nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86 >&2
    # The alternate NVRTC build (113 MB) is never loaded.
    rm -f "$DEST"/nvidia/cuda_nvrtc/lib/*.alt.so*
    touch "$STAMP"
fi
echo "export LD_LIBRARY_PATH=\"$DEST/nvidia/cuda_nvrtc/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
echo "export TESSERA_REQUIRE_NVRTC=1"
