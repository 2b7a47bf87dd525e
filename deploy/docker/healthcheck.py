#!/usr/bin/env python3
"""The container's HEALTHCHECK: exit 0 when kcoord's ``/readyz`` answers 200 (no offsets partition still
loading; a failed one is alerted on, not unhealthy), 1 otherwise (loading, stopping, or nothing listening).

It asks the metrics listener named by ``KCOORD_METRICS_LISTEN`` (HOST:PORT; a wildcard host is asked on
127.0.0.1, ``[::]`` on ``[::1]``). With the listener ``off`` there is nothing to ask: it reports healthy
and says so. Standard library only: the image has no curl.
"""

import os
import sys
import urllib.error
import urllib.request


def readyz_url(listen: str) -> str | None:
    if listen.strip().lower() == "off":
        return None
    host, _, port = listen.rpartition(":")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(host, host)
    return f"http://{host}:{port}/readyz"


def main() -> int:
    url = readyz_url(os.environ.get("KCOORD_METRICS_LISTEN", "127.0.0.1:9404"))
    if url is None:
        print("metrics listener off (KCOORD_METRICS_LISTEN=off): nothing to check")
        return 0
    try:
        with urllib.request.urlopen(url, timeout=float(os.environ.get("KCOORD_HEALTHCHECK_TIMEOUT_S", "4"))) as resp:
            print(resp.read().decode(errors="replace").strip())
            return 0
    except urllib.error.HTTPError as err:  # 503: the body lists the partitions loading or failed
        print(f"{url}: {err.code} {err.read().decode(errors='replace').strip()}")
    except (OSError, ValueError) as err:
        print(f"{url}: {err}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
