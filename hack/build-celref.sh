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
exec "$(dirname "$0")/build-oracle.sh" celref
