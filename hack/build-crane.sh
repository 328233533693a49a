#!/usr/bin/env bash
# Builds crane (github.com/google/go-containerregistry, the module pinned by hack/crane/go.sum)
# into a cache outside the repository: the tool docs/install.md names for pushing `make images`'
# OCI archives to a registry, and the tests' loopback registry (`crane registry serve`). Prints
# the binary's path on the last line of stdout; logs go to stderr. Reuses the cache while its
# stamp (the module's go.mod, go.sum and main.go) matches.
set -euo pipefail
exec "$(dirname "$0")/build-oracle.sh" crane
