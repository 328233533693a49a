#!/usr/bin/env bash
# Builds celref, the differential CEL test's oracle: kube-scheduler's own CEL evaluation of DRA
# device selectors (k8s.io/dynamic-resource-allocation/cel and k8s.io/apiserver/pkg/cel/library
# at the pinned Kubernetes version), from the committed wrapper module hack/celref, into a cache
# outside the repository. Prints the binary's path on the last line of stdout; logs go to
# stderr. Reuses the cache while its stamp (the module's go.mod, go.sum and main.go) matches.
#
# The wrapper's go.sum pins the same module versions as hack/kubebins/v1.37.2 (cel-go v0.29.2,
# staging modules v0.37.2). Measured on 2 cores (with other jobs running): cold build (modules
# already downloaded) about 60 s; a re-run with a matching stamp returns in 0.05 s.
set -euo pipefail

HACK="$(cd "$(dirname "$0")" && pwd)"
SRC="$HACK/celref"
CACHE_ROOT="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
STAMP="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-16)"
OUT="$CACHE_ROOT/celref/$STAMP"

log() { echo "[celref $(date +%H:%M:%S)] $*" >&2; }

if [[ -x "$OUT/celref" ]]; then
  log "cached: $OUT/celref"
  echo "$OUT/celref"
  exit 0
fi

export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
start=$(date +%s)
log "building celref from $SRC"
rm -rf "$OUT.tmp.$$"; mkdir -p "$OUT.tmp.$$"
(cd "$SRC" && nice go build -trimpath -buildvcs=false -o "$OUT.tmp.$$/celref" .)
# Another build of the same stamp may have finished first; either binary is the same.
mkdir -p "$OUT" && mv -f "$OUT.tmp.$$/celref" "$OUT/celref" && rm -rf "$OUT.tmp.$$"
log "done in $(( $(date +%s) - start ))s: $OUT/celref"
echo "$OUT/celref"
