#!/usr/bin/env bash
# Builds a stand-in for the official Prometheus image, prom/prometheus:v2.42.0, for docker-compose.yml
# where that image cannot be pulled: Debian bookworm's prometheus package (2.42.0) on the Debian base
# that deploy/base-image.sh builds, laid out like the official image (/bin/prometheus as entrypoint,
# data in /prometheus, user nobody, default config in /etc/prometheus/prometheus.yml).
#
#   deploy/prometheus-image.sh [TAG]     TAG defaults to prom/prometheus:v2.42.0
#
# Needs a running Docker daemon and the base image; an existing TAG is kept (FORCE=1 rebuilds it).
set -euo pipefail

tag=${1:-prom/prometheus:v2.42.0}
base=${BASE_IMAGE:-python:3.11-slim-bookworm}
if [ "${FORCE:-0}" != 1 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "prometheus-image: $tag exists (FORCE=1 rebuilds it)"
    exit 0
fi
docker image inspect "$base" >/dev/null 2>&1 \
    || { echo "prometheus-image: $base is missing: run deploy/base-image.sh first" >&2; exit 1; }

# The legacy builder (this Docker client has no buildx); --network host: apt reaches the mirror.
DOCKER_BUILDKIT=0 docker build --quiet --force-rm --network host --tag "$tag" - <<DOCKERFILE 2>&1 \
    | grep -v -E 'DEPRECATED|BuildKit|environment-variable|^ *$' || true
FROM $base
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \\
    && rm -rf /var/lib/apt/lists/* \\
    && mkdir -p /prometheus /etc/prometheus \\
    && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
VOLUME ["/prometheus"]
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
DOCKERFILE
docker run --rm --network none "$tag" --version | head -n 1
