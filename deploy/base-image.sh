#!/usr/bin/env bash
# Builds the base image the Dockerfile starts from, python:3.11-slim-bookworm, without pulling
# anything from a container registry: debootstrap a minimal Debian bookworm holding Debian's own
# Python 3.11 with venv, then `docker import` it under the official image's name.
#
#   deploy/base-image.sh [TAG]          TAG defaults to python:3.11-slim-bookworm
#
# Where the official image can be pulled, this script is not needed. It stands in for it: python3 and
# python are on PATH under /usr/local/bin (Debian's /usr/bin/python3.11), `python3 -m venv` works,
# LANG is C.UTF-8, CMD is python3. It also trusts the certificate authorities this host added locally
# (/usr/local/share/ca-certificates/*.crt; HOST_CAS=0 leaves them out): where traffic to PyPI passes
# through a TLS-inspecting proxy, as on these machines, pip in the Dockerfile's build stage needs them.
# kcoord itself makes no TLS connections. Needs root, a running Docker daemon and Debian's package mirror;
# installs debootstrap with apt-get if it is missing. An existing TAG is kept (FORCE=1 rebuilds it).
# Takes about 95 s here (most of it debootstrap); the image is about 155 MB.
set -euo pipefail

tag=${1:-python:3.11-slim-bookworm}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3-distutils stands for python3.11-venv's virtual python3.11-distutils, which debootstrap's
# resolver does not follow; ensurepip needs the pip and setuptools wheels.
packages=python3.11,python3.11-venv,python3-distutils,python3-pip-whl,python3-setuptools-whl,ca-certificates

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base-image: $tag exists (FORCE=1 rebuilds it)"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "base-image: debootstrap needs root" >&2
    exit 1
fi
if ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap >/dev/null; }
fi

work=$(mktemp -d /tmp/kcoord-base.XXXXXX)
root=$work/rootfs
cleanup() {
    # debootstrap mounts proc and sys inside the target while it runs: never delete through a mount
    grep -o " $root/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT

echo "base-image: debootstrap $suite ($mirror) into $root"
started=$SECONDS
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" "$root/debootstrap/debootstrap.log" 2>/dev/null >&2
    exit 1
}
# As the official image: python3 and python under /usr/local/bin; no package cache, lists or docs.
ln -sf /usr/bin/python3.11 "$root/usr/local/bin/python3"
if [ "${HOST_CAS:-1}" = 1 ] && compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null 2>&1
fi
ln -sf /usr/bin/python3.11 "$root/usr/local/bin/python"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/* "$root"/tmp/*
echo "base-image: debootstrap took $((SECONDS - started)) s; importing as $tag"
tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "Debian $suite minbase with Debian's python3.11 + venv (kcoord deploy/base-image.sh)" \
    - "$tag" >/dev/null
docker run --rm --network none "$tag" python3 -c 'import sys, venv, ssl; print("base-image: ready,", sys.version.split()[0])'
docker image ls "$tag"
