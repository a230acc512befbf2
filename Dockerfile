# Quarry's images are built from the package (a wheel), never from a source tree on PYTHONPATH.
#   docker build -t quarry:0.1.0 .                                 services (the default target)
#   docker build --target pipeline -t quarry-pipeline:0.1.0 .      PySpark jobs: a JRE and quarry[pipeline]
# The services image carries neither a Java runtime nor PySpark.

# Build stage: the wheel, built like any `pip install .` (setuptools + grpcio-tools from
# pyproject's build-system; setup.py generates quarry/v1 from protos/ during the build).
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY scripts/gen_protos.py ./scripts/
COPY protos ./protos
COPY quarry ./quarry
COPY formats ./formats
COPY services ./services
COPY clients ./clients
COPY pipeline ./pipeline
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

# What both images share: a venv with the pinned runtime dependencies and an unprivileged user.
FROM python:3.11.11-slim-bookworm AS runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 quarry && useradd --system --uid 10001 --gid quarry --home /data quarry \
    && mkdir -p /data && chown quarry:quarry /data
COPY requirements.txt /tmp/requirements.txt
RUN python -m venv /opt/venv && /opt/venv/bin/pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 QUARRY_LOG_FORMAT=kv
WORKDIR /data

# The pipeline image: Debian's Java 17 runtime (what scripts/ensure_java.sh installs) and the
# package with its `pipeline` extra (the pinned pyspark).
FROM runtime AS pipeline
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install "$(ls /wheels/quarry-*.whl)[pipeline]"
USER quarry
VOLUME ["/data"]
ENTRYPOINT ["quarry-pipeline"]
CMD ["--help"]

# The services image (last stage, so the default target): router, commitlog, indexer, probe, cli.
FROM runtime AS services
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-deps /wheels/quarry-*.whl
USER quarry
VOLUME ["/data"]
ENTRYPOINT ["python", "-m", "quarry.entrypoint"]
CMD ["router"]
