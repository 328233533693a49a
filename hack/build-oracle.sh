#!/usr/bin/env bash
# Builds one of the Go tools the tests run (the upstream oracles; crane), the committed wrapper
# module hack/<name>, into a cache outside the repository: build-oracle.sh NAME [cgo]. Prints the
# binary's path on the last line of stdout; logs go to stderr. Reuses the cache while its stamp (the
# module's go.mod, go.sum and main.go) matches; a re-run with a matching stamp returns at once.
# `cgo` builds with the C compiler (go-nvml's bindings need it); otherwise CGO_ENABLED=0.
# Used by build-celref.sh, build-nvmlref.sh and build-crane.sh, which say what each tool is.
set -euo pipefail

NAME="$1"
CGO="${2:-}"
HACK="$(cd "$(dirname "$0")" && pwd)"
SRC="$HACK/$NAME"
CACHE_ROOT="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
STAMP="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-16)"
OUT="$CACHE_ROOT/$NAME/$STAMP"

log() { echo "[$NAME $(date +%H:%M:%S)] $*" >&2; }

if [[ -x "$OUT/$NAME" ]]; then
  log "cached: $OUT/$NAME"
  echo "$OUT/$NAME"
  exit 0
fi

export GOWORK=off GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
if [[ "$CGO" == cgo ]]; then
  # nvml.h marks functions deprecated that go-nvml still binds: their warnings are not ours.
  export CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations"
fi
start=$(date +%s)
log "building $NAME from $SRC"
rm -rf "$OUT.tmp.$$"; mkdir -p "$OUT.tmp.$$"
(cd "$SRC" && nice go build -trimpath -buildvcs=false -o "$OUT.tmp.$$/$NAME" .)
# Another build of the same stamp may have finished first; either binary is the same.
mkdir -p "$OUT" && mv -f "$OUT.tmp.$$/$NAME" "$OUT/$NAME" && rm -rf "$OUT.tmp.$$"
log "done in $(( $(date +%s) - start ))s: $OUT/$NAME"
echo "$OUT/$NAME"
