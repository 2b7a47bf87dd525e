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
# In cluster mode (KCOORD_CLUSTER or --cluster) a node advertises its own --cluster entry: no default then.
# The last --cluster flag wins over the variable, as in kcoord; '' (or none, off, disabled) is one node.
# kcoord takes any unambiguous prefix of it too (--cl, --clu, ...: argparse's abbreviations).
# Likewise a --listen flag (or --li, --lis, ...) wins over KCOORD_LISTEN: the default is made of the port
# kcoord listens on, and given for a wildcard host only.
cluster=${KCOORD_CLUSTER:-}
listen=${KCOORD_LISTEN:-}
value_next=
for arg in "$@"; do
    case "$value_next" in
        cluster) cluster=$arg; value_next=; continue ;;
        listen) listen=$arg; value_next=; continue ;;
    esac
    case "$arg" in
        --cl|--clu|--clus|--clust|--cluste|--cluster) value_next=cluster ;;
        --cl=*|--clu=*|--clus=*|--clust=*|--cluste=*|--cluster=*) cluster=${arg#*=} ;;
        --li|--lis|--list|--liste|--listen) value_next=listen ;;
        --li=*|--lis=*|--list=*|--liste=*|--listen=*) listen=${arg#*=} ;;
    esac
done
case "$(printf '%s' "$cluster" | tr -d ' \t' | tr '[:upper:]' '[:lower:]')" in
    ''|none|off|disabled) cluster= ;;
esac
# Whether $1 is 0.0.0.0 in a shorthand a bind reads as it (0, 00, 0.0, 0x0.0: up to four parts, each
# zeros or 0x and zeros), which kcoord takes for a wildcard too (coordinator/cluster.py canonical_address).
zero_ipv4() {
    case "$1" in ''|.*|*.|*..*|*.*.*.*.*) return 1 ;; esac
    rest=$1.
    while [ -n "$rest" ]; do
        part=${rest%%.*}
        rest=${rest#*.}
        case "$part" in 0[xX]?*) part=${part#??} ;; esac
        case "$part" in ''|*[!0]*) return 1 ;; esac
    done
}
# Whether $1 (a bracketed host without its brackets) is an IPv6 spelling of a wildcard: every group zero
# (::, 0::0, ::0.0.0.0) or IPv4's 0.0.0.0 mapped (::ffff:0.0.0.0, ::ffff:0:0), as canonical_address reads
# them (an IPv4 tail in IPv6 is four plain decimal parts: no shorthand). A zone (::%eth0) leaves it a
# wildcard there; one empty or with a second % is no address. The groups are written out to eight, "::"
# filled with zeros, then read in place.
zero_ipv6() {
    case "$1" in *%*%*|*%) return 1 ;; esac
    host=$(printf '%s' "${1%%\%*}" | tr '[:upper:]' '[:lower:]')
    case "$host" in *.*) [ "${host##*:}" = 0.0.0.0 ] || return 1; host="${host%:*}:0:0" ;; esac
    case "$host" in *::*::*|*:::*|:[!:]*|*[!:]:|*[!0-9a-f:]*|'') return 1 ;; esac
    case "$host" in
        *::*) left=$(printf '%s' "${host%%::*}" | tr : ' ') right=$(printf '%s' "${host#*::}" | tr : ' ')
              set -- $left $right
              [ $# -lt 8 ] || return 1
              middle=; n=$#; while [ "$n" -lt 8 ]; do middle="$middle 0"; n=$((n + 1)); done
              set -- $left $middle $right ;;
        *) set -- $(printf '%s' "$host" | tr : ' ') ;;
    esac
    [ $# -eq 8 ] || return 1
    at=0
    for group in "$@"; do
        case "$group" in ?????*) return 1 ;; esac
        case "$at:$group" in 5:ffff) ;; *:*[!0]*) return 1 ;; esac
        at=$((at + 1))
    done
}
if [ -z "${KCOORD_ADVERTISED_LISTENER:-}" ] && [ -z "$cluster" ]; then
    wildcard=
    # A listener URL (PLAINTEXT://0.0.0.0:9092) is read by kcoord as the HOST:PORT after its "://".
    case "$listen" in *://*) listen=${listen#*://} ;; esac
    case "$listen" in
        :*) wildcard=yes ;;
        \[*\]:*) host=${listen%]:*}; host=${host#[}
                 case "$host" in  # kcoord drops the brackets around any host: [0.0.0.0] is 0.0.0.0 there
                     *:*) if zero_ipv6 "$host"; then wildcard=yes; fi ;;
                     *) if zero_ipv4 "$host"; then wildcard=yes; fi ;;
                 esac ;;
        \[*) ;;
        *:*) if zero_ipv4 "${listen%:*}"; then wildcard=yes; fi ;;
    esac
    if [ -n "$wildcard" ]; then
        KCOORD_ADVERTISED_LISTENER="$(hostname):${listen##*:}"
        export KCOORD_ADVERTISED_LISTENER
    fi
fi
exec kcoord "$@"
