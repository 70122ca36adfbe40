# syntax=docker/dockerfile:1
# Understudy service image: multi-stage, non-root, with a health check.
#
#   docker build -t understudy .
#   docker compose -f docker/compose.yaml up      # two replicas + PostgreSQL + Prometheus + Grafana
#
# Stage 1 builds a virtual environment with every runtime dependency; stage 2
# copies only that environment and the source it points at (an editable
# install, because the Alembic migrations are resolved relative to the source
# tree: service/storage/migrate.py). No compiler, pip cache or test
# dependency reaches the final image.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN python -m venv /opt/venv
# Dependencies first (a layer that changes only with pyproject.toml).
COPY pyproject.toml README.md ./
RUN mkdir -p service && touch service/__init__.py \
    && /opt/venv/bin/pip install --upgrade pip \
    && /opt/venv/bin/pip install -e . \
    && rm -rf service
COPY service/ service/
COPY migrations/ migrations/
COPY policies/ policies/
COPY protocols/ protocols/
RUN /opt/venv/bin/pip install --no-deps -e . \
    && /opt/venv/bin/understudy --help >/dev/null

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="understudy" \
      org.opencontainers.image.description="Shadow evaluation of compute placement policies"
RUN groupadd --system --gid 10001 understudy \
    && useradd --system --uid 10001 --gid understudy --home-dir /var/lib/understudy \
       --create-home --shell /usr/sbin/nologin understudy
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=root:root /app /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    UNDERSTUDY_DATA_DIR=/var/lib/understudy \
    UNDERSTUDY_POLICIES_DIR=/app/policies \
    UNDERSTUDY_GRPC_PORT=50051 \
    UNDERSTUDY_HTTP_PORT=8080
WORKDIR /app
USER understudy:understudy
VOLUME ["/var/lib/understudy"]
EXPOSE 50051 8080
# /readyz is 503 while a dependency (database, policies, journal) is down;
# liveness is /healthz. The image has no curl: use the interpreter.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["understudy"]
CMD ["serve"]
