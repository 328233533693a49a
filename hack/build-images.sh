#!/usr/bin/env bash
# Builds the test cluster's container images as OCI archives, without Docker or a registry:
#   dra-gpu.tar   ghcr.io/dra-gpu/dra-gpu:<appVersion>  (the Dockerfile's image, the chart's default)
#   pause.tar     registry.k8s.io/pause:3.10.1           (hack/pause, the sandbox image)
#   workload.tar  dra-gpu.local/workload:1               (busybox, for demo and test pods)
# Import each with `ctr -n k8s.io images import <file>`. Prints the directory holding them on
# the last line of stdout (images.json there maps each file to its image name); logs go to
# stderr. The work is hack/build_images.py (the recipe) and hack/oci_image.py (the Dockerfile
# parser and the OCI writer); hack/check-images.sh runs the archives on a throwaway containerd.
#
# Cached under ${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}/images: the Debian rootfs layer and the
# dependencies' layer are kept apart from the project's, so a code change redoes only the
# project's pip install. Needs root to build (mmdebstrap, overlay mounts, chroot: all in a
# private mount namespace); a cached result is printed without root. Measured on 2 cores (other
# jobs running): cold 56 s (Debian rootfs 24 s + packing it 5 s, dependencies' venv 23 s,
# project 3 s, archives 1 s); after a change under operator/ 4-8 s; nothing changed 0.4 s.
# Archives: dra-gpu.tar 86 MB (layers 48 + 38 + 0.5 MB gzip'd), pause.tar 0.7 MB,
# workload.tar 1 MB. pip reaches the index as this host does (PIP_CERT/REQUESTS_CA_BUNDLE's CA
# is bind-mounted for the build steps, PIP_INDEX_URL and proxies passed on; none of it is kept).
set -euo pipefail

CACHE_ROOT="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
HACK="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"

log() { echo "[images $(date +%H:%M:%S)] $*" >&2; }

debs=()
for pkg in mmdebstrap busybox-static; do
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
busybox=$(dpkg -L busybox-static | grep '/bin/busybox$')

mkdir -p "$CACHE_ROOT/images"
# One build at a time (test workers may call this together); the lock goes with the process.
exec 9>"$CACHE_ROOT/images/.lock"
flock 9
exec "$PYTHON" "$HACK/build_images.py" --repo "$HACK/.." --cache "$CACHE_ROOT/images" --busybox "$busybox"
