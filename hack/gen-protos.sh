#!/usr/bin/env bash
# Regenerates the Python gRPC stubs (api_pb2.py, api_pb2.pyi, api_pb2_grpc.py, and
# api_pb2_grpc.pyi from mypy-protobuf, which types the servicers and stubs for mypy --strict)
# next to every .proto under operator/dra_gpu/proto. Run it as `make protos` after editing a .proto file and
# commit the output: the runtime image and CI import the stubs and never need grpcio-tools.
#
# The include root is `operator`, so each file is known to protoc by its path inside the package
# (dra_gpu/proto/dra/v1/api.proto) and the generated modules import each other as
# `dra_gpu.proto.dra.v1.api_pb2`. The proto *package* (k8s.io.kubelet.pkg.apis.dra.v1, ...) only
# names the messages and services on the wire and plays no part in Python import paths.
#
# The stubs check at import time that the installed grpcio and protobuf are at least the
# versions that generated them; regenerating with a newer grpcio-tools raises that floor.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-.venv/bin/python}
PROTO_ROOT=operator/dra_gpu/proto

if ! "$PYTHON" -c 'import grpc_tools.protoc' 2>/dev/null; then
  echo "gen-protos: grpcio-tools is missing for $PYTHON; install it with: $PYTHON -m pip install -e '.[dev]'" >&2
  exit 1
fi
MYPY_GRPC=$(dirname "$PYTHON")/protoc-gen-mypy_grpc
if [[ ! -x "$MYPY_GRPC" ]]; then
  echo "gen-protos: $MYPY_GRPC is missing (mypy-protobuf); install it with: $PYTHON -m pip install -e '.[dev]'" >&2
  exit 1
fi

mapfile -t protos < <(find "$PROTO_ROOT" -name '*.proto' | LC_ALL=C sort)
if [[ ${#protos[@]} -eq 0 ]]; then
  echo "gen-protos: no .proto files under $PROTO_ROOT" >&2
  exit 1
fi

# Drop the old output first so a removed or renamed .proto leaves no stale module behind.
find "$PROTO_ROOT" \( -name '*_pb2.py' -o -name '*_pb2.pyi' -o -name '*_pb2_grpc.py' -o -name '*_pb2_grpc.pyi' \) -delete

"$PYTHON" -m grpc_tools.protoc -I operator \
  --python_out=operator --pyi_out=operator --grpc_python_out=operator \
  --plugin=protoc-gen-mypy_grpc="$MYPY_GRPC" --mypy_grpc_out=operator \
  "${protos[@]}"

# Every directory on the way down must be a package for `from dra_gpu.proto.dra.v1 import ...`.
for proto in "${protos[@]}"; do
  dir=$(dirname "$proto")
  while [[ "$dir" != "operator/dra_gpu" ]]; do
    [[ -e "$dir/__init__.py" ]] || : >"$dir/__init__.py"
    dir=$(dirname "$dir")
  done
done

"$PYTHON" -m grpc_tools.protoc --version | sed 's/^/gen-protos: generated with /'
