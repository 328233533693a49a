#!/usr/bin/env bash
# Builds nvmlref, the oracle of the fake pynvml and the nvml backend: NVIDIA's go-nvml mock
# machines (pkg/nvml/mock/dgxa100, dgxh100, dgxh200, dgxb200, and go-nvml's server factory over
# its A100-80GB and A30 configurations) answering NVML calls, with profile names from go-nvlib.
# Built from the committed wrapper module hack/nvmlref (go-nvml v0.13.4-1, go-nvlib v0.13.0,
# from the Go module proxy) into a cache outside the repository. Prints the binary's path on the
# last line of stdout; logs go to stderr. Reuses the cache while its stamp (the module's go.mod,
# go.sum and main.go) matches.
#
# go-nvml's pkg/nvml uses cgo (it dlopens libnvidia-ml at run time, which the mocks never do), so
# this needs a C compiler. Measured on 2 cores (with other jobs running): cold build (modules
# already downloaded) about 20 s; a re-run with a matching stamp returns at once.
set -euo pipefail

HACK="$(cd "$(dirname "$0")" && pwd)"
SRC="$HACK/nvmlref"
CACHE_ROOT="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
STAMP="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-16)"
OUT="$CACHE_ROOT/nvmlref/$STAMP"

log() { echo "[nvmlref $(date +%H:%M:%S)] $*" >&2; }

if [[ -x "$OUT/nvmlref" ]]; then
  log "cached: $OUT/nvmlref"
  echo "$OUT/nvmlref"
  exit 0
fi

# nvml.h marks functions deprecated that go-nvml still binds: their warnings are not ours.
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=1 GOFLAGS=-mod=mod CGO_CFLAGS="-O2 -Wno-deprecated-declarations"
start=$(date +%s)
log "building nvmlref from $SRC"
rm -rf "$OUT.tmp.$$"; mkdir -p "$OUT.tmp.$$"
(cd "$SRC" && nice go build -trimpath -buildvcs=false -o "$OUT.tmp.$$/nvmlref" .)
# Another build of the same stamp may have finished first; either binary is the same.
mkdir -p "$OUT" && mv -f "$OUT.tmp.$$/nvmlref" "$OUT/nvmlref" && rm -rf "$OUT.tmp.$$"
log "done in $(( $(date +%s) - start ))s: $OUT/nvmlref"
echo "$OUT/nvmlref"
