#!/usr/bin/env bash
# Runs the archives of hack/build-images.sh on a throwaway containerd (hack/build-containerd.sh)
# with Debian's runc: imports each into the k8s.io namespace, runs the workload image
# (`echo ok`, env, cat), the project's image (its Entrypoint+Cmd, `dra-gpu --version`, its
# user, on a read-only root) and the pause image (exits 0 on SIGTERM). Not part of `make test`:
# run it after changing the Dockerfile or the image tooling. Needs root.
#
# Everything happens in a private mount namespace (unshare -m) with containerd's root, state,
# sockets, /run and /opt/containerd under a temporary directory; containerd is stopped by its
# PID, and the script checks that nothing of it is left mounted or running.
set -euo pipefail

HACK="$(cd "$(dirname "$0")" && pwd)"
log() { echo "[check-images $(date +%H:%M:%S)] $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

if [[ "${1:-}" != --inner ]]; then
  [[ $(id -u) == 0 ]] || fail "needs root (containerd, runc, mounts)"
  ctrd=$("$HACK/build-containerd.sh" | tail -n1)
  images=$("$HACK/build-images.sh" | tail -n1)
  tmp=$(mktemp -d /tmp/dra-gpu-check-images.XXXXXX)
  rc=0
  unshare --mount --propagation private -- "$0" --inner "$ctrd" "$images" "$tmp" || rc=$?
  log "namespace closed (rc $rc)"
  for d in /sys/fs/cgroup/*/"$(basename "$tmp")"; do
    [[ -d $d ]] || continue
    rmdir "$d" || { log "FAIL: cgroup $d is left"; rc=1; }
  done
  # The namespace is gone with its last process: nothing of it may be visible here.
  if grep -F "$tmp" /proc/self/mountinfo >&2; then
    log "FAIL: mounts under $tmp are left (above)"; rc=1
  fi
  # Shims exit shortly after their task is deleted.
  for _ in $(seq 50); do pgrep -f -- "$tmp" >/dev/null || break; sleep 0.1; done
  if left=$(pgrep -f -- "$tmp"); then
    log "FAIL: processes left (killing them): $(echo "$left" | tr '\n' ' ')"; rc=1
    for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
  else
    log "removing $tmp"
    rm -rf "$tmp"
  fi
  ((rc == 0)) && log "all checks passed"
  exit "$rc"
fi

ctrd=$2 images=$3 tmp=$4
export PATH="$ctrd/bin:$PATH"
runc=$(command -v runc) || fail "runc is not installed (hack/build-containerd.sh installs it)"
sock="$tmp/containerd.sock"
# Shims put their sockets in /run/containerd/s and runc its state in /run/containerd/runc:
# a private /run keeps both off the host.
mkdir -p "$tmp/run"
mount --bind "$tmp/run" /run
cat > "$tmp/config.toml" <<EOF
version = 3
root = "$tmp/root"
state = "$tmp/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$tmp/opt"
EOF
containerd --config "$tmp/config.toml" >"$tmp/containerd.log" 2>&1 &
cpid=$!
stop() {
  # Tasks still there (a failed check) are killed first: their shims would outlive containerd.
  local id
  kill -0 "$cpid" 2>/dev/null || return 0
  for id in $(ctr task ls -q); do
    ctr task kill --signal SIGKILL "$id" || true
    ctr task delete --force "$id" >/dev/null || true
  done
  for id in $(ctr containers ls -q); do ctr containers delete "$id" || true; done
  for id in $(jobs -p); do [[ $id == "$cpid" ]] || kill "$id" 2>/dev/null || true; done
  kill -TERM "$cpid"
  wait || true
}
trap 'stop; [[ $ok == 1 ]] || tail -n 30 "$tmp/containerd.log" >&2' EXIT
ok=0
# (ctr warns on every call that cgroup v1 is deprecated: known, see real-node.md.)
ctr() { command ctr --address "$sock" --namespace k8s.io "$@" 2> >(grep -v 'support for cgroup v1 is deprecated' >&2); }
for _ in $(seq 100); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done
ctr version >/dev/null || fail "containerd did not come up"
log "containerd $(command ctr --version | awk '{print $3}') up (pid $cpid), root $tmp/root"

declare -A names
while IFS=$'\t' read -r file name; do names[$file]=$name; done < <(
  python3 -c 'import json,sys; [print(f"{k}\t{v}") for k,v in json.load(open(sys.argv[1])).items()]' "$images/images.json")
for file in "${!names[@]}"; do
  log "import $file ($(du -h "$images/$file" | cut -f1)) as ${names[$file]}"
  ctr images import "$images/$file" >&2
  ctr images ls -q | grep -xF "${names[$file]}" >/dev/null || fail "${names[$file]} is not listed after import"
done
workload=${names[workload.tar]} project=${names[dra-gpu.tar]} pause=${names[pause.tar]}

# Each container's cgroup sits under one parent of ours (ctr's default is /k8s.io/<id>, which
# would stay behind on the host), removed at the end.
cg=$(basename "$tmp")
# run ID [ctr run flags] IMAGE [COMMAND...]
run() {
  local id=$1 flags=()
  shift
  while [[ $1 == --* ]]; do flags+=("$1"); shift; done
  local image=$1
  shift
  ctr run --rm --runc-binary "$runc" --cgroup "/$cg/$id" "${flags[@]}" "$image" "$id" "$@"
}
out=$(run check-workload "$workload" sh -c 'echo ok; env; cat /etc/passwd')
[[ $(head -n1 <<<"$out") == ok ]] || fail "workload: expected ok, got: $out"
grep -q '^PATH=/usr/local/sbin' <<<"$out" || fail "workload: no PATH from the image config: $out"
log "workload image: echo ok, env, cat: ok"

out=$(run check-help --read-only "$project") || fail "project image, Entrypoint+Cmd: $out"
grep -qi 'usage' <<<"$out" || fail "project image: \`dra-gpu --help\` printed no usage: $out"
version=$(run check-version --read-only "$project" dra-gpu --version) || fail "dra-gpu --version: $version"
ids=$(run check-user --read-only "$project" python3 -c 'import os, sys; print(os.getuid(), os.getgid(), sys.executable, sys.prefix)')
[[ $ids == "65532 65532 /opt/dra-gpu/bin/python3 /opt/dra-gpu" ]] || fail "project image runs as/with: $ids"
log "project image: dra-gpu --help (Entrypoint+Cmd) ok; --version: $version; uid/gid/python: $ids"

run check-pause "$pause" >/dev/null &
rpid=$!
for _ in $(seq 50); do [[ $(ctr task ls | awk '$1=="check-pause"{print $3}') == RUNNING ]] && break; sleep 0.1; done
[[ $(ctr task ls | awk '$1=="check-pause"{print $3}') == RUNNING ]] || fail "pause is not running"
ctr task kill --signal SIGTERM check-pause
rc=0; wait "$rpid" || rc=$?
((rc == 0)) || fail "pause exited $rc on SIGTERM"
log "pause image: running, exits 0 on SIGTERM"

[[ -z $(ctr task ls -q) ]] || fail "tasks left: $(ctr task ls -q)"
ok=1
log "stopping containerd (pid $cpid)"
stop
log "containerd stopped"
# Everything containerd mounted (snapshots, shims' rootfs) must be gone before the namespace is.
if grep -F "$tmp/" /proc/self/mountinfo | grep -vF " $tmp/run " >&2; then
  fail "containerd left mounts (above)"
fi
umount /run
