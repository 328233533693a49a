#!/usr/bin/env bash
# Installs Prometheus and promtool for the tests and `make run`: Debian's `prometheus` package
# (bookworm: 2.42, which has `promtool test rules` and `promtool check metrics`), downloaded
# with apt and unpacked into a per-version cache outside the repository -- not installed: no
# service is started, no system file changes, none of its web UI dependencies come along.
# Prints the directory holding bin/prometheus and bin/promtool on the last line of stdout; logs
# go to stderr. Reuses the cache when its stamp matches (a re-run takes ~0.1 s).
#
# Why Debian's build and not one from the Go module: building prometheus and promtool from
# github.com/prometheus/prometheus takes several minutes and ~1 GB of modules on 2 cores; the
# package is a 19 MB download unpacked in ~2 s. Set PROMETHEUS_DEB_VERSION to pin another.
set -euo pipefail

CACHE_ROOT="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
log() { echo "[prometheus $(date +%H:%M:%S)] $*" >&2; }

version="${PROMETHEUS_DEB_VERSION:-}"
if [[ -z "$version" ]]; then
  # The newest cached one when apt cannot say (no package lists yet, offline).
  version=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^  Candidate: //p')
  if [[ -z "$version" || "$version" == "(none)" ]]; then
    if [[ $(id -u) == 0 ]]; then
      log "updating the package lists"
      apt-get update -qq >&2
      version=$(apt-cache policy prometheus | sed -n 's/^  Candidate: //p')
    fi
  fi
fi
if [[ -z "$version" || "$version" == "(none)" ]]; then
  cached=$(ls -d "$CACHE_ROOT"/prometheus/*/ 2>/dev/null | sort -V | tail -1)
  if [[ -n "$cached" && -x "$cached/bin/promtool" ]]; then
    log "apt knows no prometheus package; using the cached ${cached%/}"
    echo "${cached%/}"
    exit 0
  fi
  log "no Debian prometheus package found (run apt-get update as root)"
  exit 1
fi

OUT="$CACHE_ROOT/prometheus/$version"
STAMP="prometheus=$version"
if [[ -f "$OUT/STAMP" && "$(cat "$OUT/STAMP")" == "$STAMP" ]]; then
  log "cached: $OUT ($STAMP)"
  echo "$OUT"
  exit 0
fi

start=$(date +%s)
rm -rf "$OUT.tmp"; mkdir -p "$OUT.tmp/deb"
log "downloading Debian's prometheus $version (19 MB)"
# apt-get download writes into the current directory; the _apt sandbox user may not be able
# to, which apt only warns about.
(cd "$OUT.tmp/deb" && apt-get download -qq "prometheus=$version" 2>&1 | grep -v unsandboxed >&2 || true)
deb=$(ls "$OUT.tmp"/deb/prometheus_*.deb 2>/dev/null | head -1)
[[ -n "$deb" ]] || { log "apt-get download prometheus=$version failed"; exit 1; }
dpkg-deb -x "$deb" "$OUT.tmp/root"
mkdir -p "$OUT.tmp/bin"
mv "$OUT.tmp/root/usr/bin/prometheus" "$OUT.tmp/root/usr/bin/promtool" "$OUT.tmp/bin/"
rm -rf "$OUT.tmp/deb" "$OUT.tmp/root"
"$OUT.tmp/bin/promtool" --version >/dev/null
echo "$STAMP" > "$OUT.tmp/STAMP"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
log "unpacked into $OUT in $(( $(date +%s) - start ))s"
echo "$OUT"
