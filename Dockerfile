# syntax=docker/dockerfile:1
#
# llm-exporter container image.
#
#   docker build -t llm-exporter .
#   docker run --rm -p 9480:9480 llm-exporter run --engine http://HOST:8000 --gpu-backend none
#
# GPUs: NVML (libnvidia-ml.so) is not in the image; the NVIDIA Container Toolkit mounts the host
# driver's copy at start. Run with `--gpus all` (or `--runtime nvidia -e NVIDIA_VISIBLE_DEVICES=all`);
# the image sets NVIDIA_DRIVER_CAPABILITIES=utility, the only capability NVML needs. Without a GPU
# the exporter still runs (--gpu-backend auto falls back to none). See docs/deploy.md.
#
# The final stage has no compiler and no build tools, runs as uid 10001 and writes nothing at run
# time, so `--read-only` (readOnlyRootFilesystem in Kubernetes) works without any tmpfs.
#
# `make image` builds it with podman or docker (deploy/container.py). PYTHON_IMAGE is any image with
# Python 3.10+ and its venv module: the public python:3.11-slim by default, or, where no registry
# answers, a Debian bookworm base that `make image` makes locally with debootstrap. A build behind a
# TLS-intercepting proxy passes its CA bundle as the build secret `ca-certificates`
# (`--secret id=ca-certificates,src=/etc/ssl/certs/ca-certificates.crt`): pip trusts it in the build
# stage only, and nothing of it reaches the image.

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: a wheel of this project, installed with its pinned dependencies into /opt/venv -------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY exporter ./exporter
# Binary wheels only for the dependencies: one that would need a compiler fails the build instead
# of pulling one in. pip byte-compiles the venv here, so nothing is written at run time, then leaves
# (the image installs nothing at run time). python3, not python: a Debian base has no `python`
# outside the venv.
RUN --mount=type=secret,id=ca-certificates,required=false \
    if [ -s /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --only-binary=:all: -c constraints.txt /wheels/llm_exporter-*.whl \
 && /opt/venv/bin/llm-exporter --version \
 && /opt/venv/bin/python -m pip uninstall -q -y pip setuptools

# --- final: slim runtime, non-root ---------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llm-exporter" \
      org.opencontainers.image.description="Prometheus sidecar for LLM inference engines: engine, GPU and host metrics, and where the bottleneck is" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 llm-exporter \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin llm-exporter
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    LLM_EXPORTER_LISTEN=0.0.0.0:9480
# Numeric uid so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /
EXPOSE 9480
# python, not curl (slim has no curl). Reads the port from LLM_EXPORTER_LISTEN: change the port
# through that variable, not --listen, or this check probes the wrong one.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('LLM_EXPORTER_LISTEN', ':9480').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4)"]
ENTRYPOINT ["llm-exporter"]
CMD ["run"]
