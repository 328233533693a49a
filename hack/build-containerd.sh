#!/usr/bin/env bash
# Builds the node runtime a real test node needs from the upstream Go modules: containerd
# v2.2.9 (containerd, ctr, containerd-shim-runc-v2) into a per-version cache outside the
# repository, and makes sure Debian's packages for the rest of the node are installed: runc
# (the OCI runtime), containernetworking-plugins (bridge, host-local, loopback under
# /usr/lib/cni), socat (kubectl port-forward) and mmdebstrap + busybox-static (for
# hack/build-images.sh). Prints the output directory on the last line of stdout; logs go to
# stderr. Reuses the cache when its stamp matches. See shared/reference/real-node.md.
#
# Debian bookworm's own containerd is 1.6 (no CDI), hence the build. Measured on 2 cores (with
# other jobs running): cold build (empty Go build cache, modules already downloaded) 159 s,
# nearly all of it containerd + ctr (the shim then takes ~1 s); binaries 72 MB; a re-run with a
# matching stamp returns in 0.05 s.
set -euo pipefail

CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.2.9}"
CACHE_ROOT="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
OUT="$CACHE_ROOT/node/containerd-$CONTAINERD_VERSION"
TAGS="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"
STAMP="containerd=$CONTAINERD_VERSION tags=$TAGS"
HACK="$(cd "$(dirname "$0")" && pwd)"
PKG=github.com/containerd/containerd/v2

log() { echo "[containerd $(date +%H:%M:%S)] $*" >&2; }

# --- Debian packages (installed only when missing).
debs=()
for pkg in runc containernetworking-plugins socat mmdebstrap busybox-static; do
  dpkg -s "$pkg" >/dev/null 2>&1 || debs+=("$pkg")
done
if ((${#debs[@]})); then
  if [[ $(id -u) != 0 ]]; then
    log "missing Debian packages (install them as root): ${debs[*]}"
    exit 1
  fi
  log "installing Debian packages: ${debs[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debs[@]}" >&2 || {
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debs[@]}" >&2
  }
fi

if [[ -f "$OUT/STAMP" && "$(cat "$OUT/STAMP")" == "$STAMP" ]]; then
  log "cached: $OUT ($STAMP)"
  echo "$OUT"
  exit 0
fi

export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
start=$(date +%s)

# The committed wrapper module (hack/containerd) pins the supported version with its go.sum; any
# other version gets a module generated in the cache.
if grep -qE "^\s*(require )?$PKG $CONTAINERD_VERSION\b" "$HACK/containerd/go.mod" 2>/dev/null; then
  src="$HACK/containerd"
else
  src="$CACHE_ROOT/src/containerd-$CONTAINERD_VERSION"
  log "generating wrapper module for containerd $CONTAINERD_VERSION in $src"
  rm -rf "$src"; mkdir -p "$src"
  (
    cd "$src"
    go mod init example.invalid/containerd >/dev/null 2>&1
    go get -tool "$PKG/cmd/containerd@$CONTAINERD_VERSION" "$PKG/cmd/ctr@$CONTAINERD_VERSION" \
      "$PKG/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" >&2
    # GODEBUG defaults as containerd's own build has them (its go.mod's go line).
    gomod=$(go mod download -json "$PKG@$CONTAINERD_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    go mod edit -go=1.26.0 "-godebug=default=go$(sed -n 's/^go \([0-9]*\.[0-9]*\).*/\1/p' "$gomod")"
    go mod tidy >&2
  )
fi

# Stamped as containerd's Makefile does (version.Version/Revision/Package). The proxy has no git
# commit, so the revision is the module's go.sum hash, which pins the same source.
revision=$(sed -n "s#^$PKG $CONTAINERD_VERSION \(h1:.*\)#\1#p" "$src/go.sum")
ld="-s -w -X $PKG/version.Version=$CONTAINERD_VERSION -X $PKG/version.Revision=$revision -X $PKG/version.Package=$PKG"
rm -rf "$OUT.tmp"; mkdir -p "$OUT.tmp/bin"
log "building containerd and ctr $CONTAINERD_VERSION (about 3 min cold on 2 cores)"
(cd "$src" && go build -trimpath -buildvcs=false -tags "$TAGS" -ldflags "$ld" -o "$OUT.tmp/bin/" \
  "$PKG/cmd/containerd" "$PKG/cmd/ctr")
# The shim as upstream builds it: no gRPC server (ttrpc only).
log "building containerd-shim-runc-v2"
(cd "$src" && go build -trimpath -buildvcs=false -tags "$TAGS no_grpc" -ldflags "$ld" \
  -o "$OUT.tmp/bin/containerd-shim-runc-v2" "$PKG/cmd/containerd-shim-runc-v2")
"$OUT.tmp/bin/containerd" --version >&2

echo "$STAMP" > "$OUT.tmp/STAMP"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
log "done in $(( $(date +%s) - start ))s: $OUT ($(du -sh "$OUT" | cut -f1))"
echo "$OUT"
