# Stand-ins for the registry-only images of docker/compose.yaml, built from a local Debian base for
# the compose test tier (no container registry is reachable there): PostgreSQL and Redis from Debian's
# packages, and moto's S3 server in place of MinIO. Each honours the interface compose.yaml uses with
# the real image (POSTGRES_* variables and PGPORT; redis-server's arguments; MinIO's `server DIR
# --address H:P` and `mc ready`), so the override changes images and networking only.
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS postgres
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-common \
    && sed -i 's/^#\?\s*create_main_cluster.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/*
COPY tests/compose/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PGDATA=/var/lib/postgresql/data
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint"]
CMD ["postgres"]

FROM ${BASE_IMAGE} AS redis
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
USER redis
WORKDIR /var/lib/redis
CMD ["redis-server"]

FROM ${BASE_IMAGE} AS s3
ARG UV_VERSION=0.13.9
COPY constraints.txt /opt/s3-standin/
# moto's server at the version the lock pins (the one the rest of the suite runs).
RUN --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export SSL_CERT_FILE=/run/secrets/build_ca PIP_CERT=/run/secrets/build_ca; fi \
    && python3 -m venv /opt/s3-standin/venv \
    && /opt/s3-standin/venv/bin/pip install --quiet --no-cache-dir -c /opt/s3-standin/constraints.txt "moto[server]" \
    && useradd --uid 10002 --create-home s3
COPY tests/compose/s3-standin.py /usr/local/bin/minio
RUN ln -s /usr/local/bin/minio /usr/local/bin/mc
USER s3
ENTRYPOINT ["/usr/local/bin/minio"]
