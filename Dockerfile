# One image for every Quarry service: `docker run quarry router|commitlog|indexer|probe|cli …`.
# Build stage: install pinned dependencies into a venv and generate the protobuf stubs.
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY requirements.txt pyproject.toml README.md ./
RUN python -m venv /opt/venv && /opt/venv/bin/pip install -r requirements.txt
COPY protos ./protos
COPY scripts/gen_protos.py ./scripts/gen_protos.py
COPY quarry ./quarry
RUN /opt/venv/bin/python scripts/gen_protos.py
COPY formats ./formats
COPY services ./services
COPY clients ./clients

# Final stage: the venv and the code only; no compilers, no grpcio-tools use at run time.
FROM python:3.11.11-slim-bookworm
RUN groupadd --system --gid 10001 quarry && useradd --system --uid 10001 --gid quarry --home /app quarry \
    && mkdir -p /data && chown quarry:quarry /data
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=quarry:quarry /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/app PYTHONUNBUFFERED=1 QUARRY_LOG_FORMAT=kv
WORKDIR /app
USER quarry
VOLUME ["/data"]
ENTRYPOINT ["python", "-m", "quarry.services.entrypoint"]
CMD ["router"]
