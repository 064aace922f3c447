# node-workload-summary: a slim, non-root image holding the wheel and its dependencies, nothing else
# (no extras, no tooling: the sources and the build backend stay in the build stage).
# Build it with `make image` (deploy/image.py): it pins BASE by digest when a registry serves it,
# sets the labels below from the checkout, and reports the size of each layer.
# BASE: any image with python3.11+ (as `python`), pip and the openssl command.
ARG BASE=python:3.11-slim
FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
WORKDIR /src
# Exactly what the wheel is made of (tests/test_wheel.py checks the same list).
COPY pyproject.toml README.md LICENSE ./
COPY node_workload_summary ./node_workload_summary
COPY kubeindex ./kubeindex
COPY exporter ./exporter
COPY reconciler ./reconciler
RUN pip wheel --no-deps --wheel-dir /dist .

FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
# The wheel is mounted, not copied, so it leaves no layer; the virtualenv gets no pip of its own.
RUN --mount=type=bind,from=build,source=/dist,target=/dist \
    python -m venv --without-pip /opt/venv && \
    pip --python /opt/venv/bin/python install --no-compile /dist/*.whl && \
    find /opt/venv -name "__pycache__" -prune -exec rm -rf {} +
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
# 8080: /metrics (HTTPS with --metrics-secure; its self-signed certificate is made by the openssl
# command, which the base image has as a dependency of ca-certificates); 8081: --probe-port.
EXPOSE 8080 8081
ENTRYPOINT ["node-workload-summary"]
# Last, so a new commit rebuilds no layer above: only the image's config changes.
ARG VERSION=unknown
ARG REVISION=unknown
ARG SOURCE=""
ENV NODE_WORKLOAD_SUMMARY_REVISION=${REVISION}
LABEL org.opencontainers.image.title="node-workload-summary" \
      org.opencontainers.image.description="Node-group and root-workload summaries for large Kubernetes clusters" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
