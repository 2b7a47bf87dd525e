# kcoord, the standalone Kafka group coordinator, as a container (deploy/README.md says how to build and
# run it; deploy/smoke.sh builds it and checks it end to end).
#
# Two stages: `build` makes a virtual environment in /opt/kcoord holding kcoord and its dependencies
# (uvloop included); the runtime stage copies only that venv onto the same slim Python base and runs it
# as an unprivileged user with the offsets log on a volume. Where the official python image cannot be
# pulled, deploy/base-image.sh builds a stand-in under the same name.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# A C compiler and Python's headers, so that installing kcoord compiles its loader and request hot
# paths with mypyc (setup.py): without them the image ran them all interpreted. Debian's headers are
# for the stand-in base from deploy/base-image.sh (Debian's Python); the official image has its own.
# Only in this stage: the runtime stage gets the built venv. Versions pinned to bookworm's series.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        'gcc=4:12.*' 'libc6-dev=2.36-*' 'python3.11-dev=3.11.*' \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/kcoord
# Dependencies first, read from pyproject.toml: this layer is rebuilt only when they change.
COPY pyproject.toml setup.py ./
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > requirements.txt \
    && /opt/kcoord/bin/pip install --requirement requirements.txt
COPY coordinator ./coordinator
COPY protocol ./protocol
COPY storage ./storage
COPY pipeline ./pipeline
# kcoord itself; then the venv must import uvloop (the faster event loop), hold every compiled module
# of protocol/compiled.py (-P: imported from the venv, not from the sources in /src) and need no pip
# at run time.
RUN /opt/kcoord/bin/pip install --no-deps . \
    && /opt/kcoord/bin/pip check \
    && /opt/kcoord/bin/python -c 'import uvloop, coordinator.cli' \
    && /opt/kcoord/bin/python -P -c 'import importlib, sys; from protocol.compiled import MODULES, is_compiled; \
        missing = [m for m in MODULES if not is_compiled(importlib.import_module(m))]; \
        sys.exit(f"not compiled: {missing}" if missing else 0)' \
    && /opt/kcoord/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kcoord" \
      org.opencontainers.image.description="A standalone Kafka group coordinator (FindCoordinator, OffsetCommit, OffsetFetch, classic groups) over a durable __consumer_offsets log"
# A fixed, unprivileged uid/gid: Kubernetes' runAsUser/fsGroup and bind mounts can name it.
RUN groupadd --gid 10001 kcoord \
    && useradd --uid 10001 --gid kcoord --home-dir /var/lib/kcoord --no-create-home --no-log-init \
        --shell /usr/sbin/nologin kcoord \
    && mkdir -p /var/lib/kcoord \
    && chown kcoord:kcoord /var/lib/kcoord
COPY --from=build /opt/kcoord /opt/kcoord
COPY deploy/docker/entrypoint.sh /usr/local/bin/kcoord-entrypoint
COPY deploy/docker/healthcheck.py /usr/local/bin/kcoord-healthcheck
# Every flag of `kcoord serve` has an environment variable (README.md, "Configuration"). Inside a
# container kcoord listens on every interface; KCOORD_ADVERTISED_LISTENER is what clients are told
# to connect to (set it; without it the entrypoint advertises this container's hostname).
ENV PATH=/opt/kcoord/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KCOORD_LISTEN=0.0.0.0:9092 \
    KCOORD_METRICS_LISTEN=0.0.0.0:9404 \
    KCOORD_DATA_DIR=/var/lib/kcoord
VOLUME ["/var/lib/kcoord"]
EXPOSE 9092 9404
# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
WORKDIR /var/lib/kcoord
# /readyz: 200 once every offsets partition is loaded. Loading a large log takes a while, hence the
# start period; kcoord exits on its own when it cannot serve, so a failing check only marks it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 CMD ["kcoord-healthcheck"]
# kcoord stops cleanly on SIGTERM within --shutdown-timeout-ms (10 s by default): give `docker stop`
# a longer grace period than that (docker stop -t 30, or stop_grace_period in compose).
STOPSIGNAL SIGTERM
ENTRYPOINT ["kcoord-entrypoint"]
CMD ["serve"]
