#!/usr/bin/env bash
# Builds the local cluster from the upstream Go modules into a per-version cache outside the
# repository: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl
# and helm. Prints the cache directory on the last line of stdout.
# Reuses the cache when its stamp matches. See shared/reference/real-control-plane.md.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE_ROOT="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}"
OUT="$CACHE_ROOT/bin/$K8S_VERSION"
STAMP="k8s=$K8S_VERSION etcd=$ETCD_VERSION helm=$HELM_VERSION"
HACK="$(cd "$(dirname "$0")" && pwd)"

log() { echo "[kubebins $(date +%H:%M:%S)] $*" >&2; }
# The committed wrapper modules (hack/kubebins/<version>, hack/etcd, hack/helm) pin the supported
# versions with their go.sum; any other version gets a module generated in the cache.
committed_version() { grep -qE "^\s*(require )?$2 $3\b" "$1/go.mod" 2>/dev/null; }

if [[ -f "$OUT/STAMP" && "$(cat "$OUT/STAMP")" == "$STAMP" ]]; then
  log "cached: $OUT ($STAMP)"
  echo "$OUT"
  exit 0
fi

export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
staging="v0.${K8S_VERSION#v1.}"
mkdir -p "$OUT.tmp"
start=$(date +%s)

# --- Kubernetes: a wrapper module whose replaces pin every staging module (§2).
src="$CACHE_ROOT/src/kubebins-$K8S_VERSION"
if committed_version "$HACK/kubebins/$K8S_VERSION" k8s.io/kubernetes "$K8S_VERSION"; then
  log "using committed wrapper module hack/kubebins/$K8S_VERSION"
  src="$HACK/kubebins/$K8S_VERSION"
else
  log "generating wrapper module for $K8S_VERSION in $src"
  rm -rf "$src"; mkdir -p "$src"
  (
    cd "$src"
    go mod init example.invalid/kubebins >/dev/null 2>&1
    gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$gomod"); do
      go mod edit -replace="$m=$m@$staging"
    done
    log "resolving k8s.io/kubernetes $K8S_VERSION (module download, several minutes when cold)"
    go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" >&2
    # Go takes GODEBUG defaults from the main module: restate the version's own (a value derived
    # from the minor number can be newer than the toolchain, which Go refuses).
    go mod edit "-$(grep -m1 '^godebug ' "$gomod" | tr -s ' ' | sed 's/^godebug /godebug=/')"
    go mod tidy >&2
  )
fi

date_now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ld="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date_now"
done
log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl (about 10 min cold on 2 cores)"
(cd "$src" && go build -trimpath -buildvcs=false -tags selinux,notest -ldflags "$ld" -o "$OUT.tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl)

# --- etcd: a separate module so the two dependency graphs stay independent (§3).
log "building etcd $ETCD_VERSION"
if committed_version "$HACK/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"; then
  esrc="$HACK/etcd"
else
  esrc="$CACHE_ROOT/src/etcd-$ETCD_VERSION"
  rm -rf "$esrc"; mkdir -p "$esrc"; cp "$HACK/etcd/main.go" "$esrc/"
  (
    cd "$esrc"
    go mod init example.invalid/etcd >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
    go mod tidy >&2
  )
fi
(cd "$esrc" && go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$OUT.tmp/etcd" .)

# --- helm 3, stamped with its version and the Kubernetes version it assumes offline (§8).
log "building helm $HELM_VERSION"
hld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  hld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
done
if committed_version "$HACK/helm" helm.sh/helm/v3 "$HELM_VERSION"; then
  hsrc="$HACK/helm"
else
  hsrc="$CACHE_ROOT/src/helm-$HELM_VERSION"
  rm -rf "$hsrc"; mkdir -p "$hsrc"
  (
    cd "$hsrc"
    go mod init example.invalid/helm >/dev/null 2>&1
    go get -tool "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
    go mod tidy >&2
  )
fi
(cd "$hsrc" && go build -trimpath -buildvcs=false -ldflags "$hld" -o "$OUT.tmp/helm" helm.sh/helm/v3/cmd/helm)

echo "$STAMP" > "$OUT.tmp/STAMP"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
log "done in $(( $(date +%s) - start ))s: $OUT ($(du -sh "$OUT" | cut -f1))"
echo "$OUT"
