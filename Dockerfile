# node-workload-summary: a slim, non-root image (multi-stage: nothing of the build stays behind).
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY node_workload_summary ./node_workload_summary
COPY kubeindex ./kubeindex
COPY exporter ./exporter
COPY reconciler ./reconciler
COPY alerts ./alerts
COPY dashboards ./dashboards
COPY localkube ./localkube
COPY demo ./demo
RUN python -m venv /opt/venv && /opt/venv/bin/pip install --no-compile . && \
    find /opt/venv -name "__pycache__" -prune -exec rm -rf {} +

FROM python:3.11-slim
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["node-workload-summary"]
