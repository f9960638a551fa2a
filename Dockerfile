# syntax=docker/dockerfile:1
# One image for fgpu's Kubernetes components (docs/kubernetes.md, "The image"); the
# manifests pick the component by its arguments:
#   fgpu k8s scheduler    the secondary scheduler (Deployment)
#   fgpu k8s webhook      the admission webhook (Deployment)
#   fgpu k8s node-agent   the node agent and DRA driver (DaemonSet)
# NVML: the agent talks to the GPUs through nvidia-ml-py, which loads libnvidia-ml.so.1 of
# the HOST's driver; the image carries no driver. The NVIDIA container toolkit injects the
# library into the agent's container (NVIDIA_DRIVER_CAPABILITIES=utility, set by the
# DaemonSet), so the library always matches the node's kernel module.
# Build from the repository's root:  docker build -t registry.example.com/fgpu:0.1.0 .

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# the interposer and its helpers are C, compiled while pip builds the wheel
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md hatch_build.py ./
COPY native/ native/
COPY src/ src/
RUN python -m venv /opt/fgpu \
    && /opt/fgpu/bin/pip install --no-cache-dir '.[k8s]'

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/fgpu /opt/fgpu
ENV PATH=/opt/fgpu/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# non-root by default (scheduler, webhook); the DaemonSet runs the agent as root, which the
# kubelet's plugin folders need
USER 65532:65532
ENTRYPOINT ["fgpu"]
CMD ["--help"]
