# node-workload-summary: a slim, non-root image holding the wheel and its dependencies, nothing else
# (no extras, no tooling: the sources and the build backend stay in the build stage).
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Exactly what the wheel is made of (tests/test_wheel.py checks the same list).
COPY pyproject.toml README.md ./
COPY node_workload_summary ./node_workload_summary
COPY kubeindex ./kubeindex
COPY exporter ./exporter
COPY reconciler ./reconciler
RUN pip wheel --no-deps --wheel-dir /dist .

FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
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
