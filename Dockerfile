# syntax=docker/dockerfile:1
# One image for both components: `dra-gpu controller` (Deployment) and `dra-gpu agent`
# (DaemonSet); the Helm chart (charts/dra-gpu) runs it with args only.
#
#   docker build -t ghcr.io/dra-gpu/dra-gpu:0.1.0 .
#
# The builder installs the package and its runtime dependencies (wheels only: protobuf, PyYAML
# and multidict ship manylinux wheels, the rest is pure Python) into a virtual environment; the
# final stage is the same slim base with that venv and nothing else: no pip cache, no
# compilers, no tests.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ONLY_BINARY=:all:
RUN python -m venv /opt/dra-gpu
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# setuptools builds our own (pure Python) wheel; every dependency must come as a wheel.
RUN /opt/dra-gpu/bin/pip install --no-binary=dra-gpu --only-binary=:all: . \
    && /opt/dra-gpu/bin/dra-gpu --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dra-gpu" \
      org.opencontainers.image.description="Kubernetes DRA driver for GPUs: controller and node agent" \
      org.opencontainers.image.source="https://github.com/dra-gpu/dra-gpu" \
      org.opencontainers.image.licenses="Apache-2.0"
# Bytecode was compiled at install time; the root filesystem is read-only in the chart.
ENV PATH=/opt/dra-gpu/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /opt/dra-gpu /opt/dra-gpu
# Non-root by default (the controller). The agent's pod runs it as root, unprivileged with no
# capabilities, for the kubelet's plugin directories: see charts/dra-gpu/templates/agent-daemonset.yaml.
USER 65532:65532
ENTRYPOINT ["dra-gpu"]
CMD ["--help"]
