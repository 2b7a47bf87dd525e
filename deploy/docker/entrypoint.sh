#!/bin/sh
# The container's entrypoint: runs `kcoord ARGS` (CMD is `serve`) as PID 1, so SIGTERM from
# `docker stop` or Kubernetes reaches kcoord itself.
#
# A coordinator listening on a wildcard address (KCOORD_LISTEN=0.0.0.0:9092, the image's default)
# would otherwise advertise 0.0.0.0 to clients in FindCoordinator and Metadata. When
# KCOORD_ADVERTISED_LISTENER is not set, advertise this container's hostname and the listen port
# instead (Kafka advertises its canonical hostname the same way). Set it explicitly whenever clients
# reach kcoord under another name: a Kubernetes pod's DNS name, a published port, a load balancer.
set -eu
if [ -z "${KCOORD_ADVERTISED_LISTENER:-}" ]; then
    listen=${KCOORD_LISTEN:-}
    case "$listen" in
        0.0.0.0:*|\[::\]:*|\[::0\]:*|\[0:0:0:0:0:0:0:0\]:*|:*)
            KCOORD_ADVERTISED_LISTENER="$(hostname):${listen##*:}"
            export KCOORD_ADVERTISED_LISTENER
            ;;
    esac
fi
exec kcoord "$@"
