"""Kubelet gRPC protocols: our .proto files and the Python stubs generated from them.

Import the versioned modules, e.g. ``from dra_gpu.proto.dra.v1 import api_pb2, api_pb2_grpc``.
The stubs are generated (see README.md) and committed; never edit them by hand.
"""
