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
exec "$(dirname "$0")/build-oracle.sh" nvmlref cgo
