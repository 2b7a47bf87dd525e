#!/usr/bin/env bash
# Smoke test of the container, end to end, against a real Docker daemon:
#   1. build the image from the top-level Dockerfile (the base image must exist: deploy/base-image.sh);
#   2. run it with host networking on free loopback ports and a fresh named volume, with a read-only
#      root file system and no capabilities;
#   3. wait for /readyz and for Docker's own HEALTHCHECK to report healthy; check the user is not root
#      and the event loop is uvloop;
#   4. commit offsets with a stock client (kafka-python, from the host's Python) and read them back;
#      /metrics counts them;
#   5. keep a client committing, and `docker stop` (SIGTERM) while its commits are in flight: exit code
#      0 and "kcoord stopped" in the log, with nothing abandoned;
#   6. start a new container on the same volume: every acknowledged offset is still there.
# Everything it creates (containers, volume) is removed on exit; the image is kept (KEEP_IMAGE=0
# removes it). Exit code 0: passed; 1: failed; 2: cannot run here (no daemon, no base image, no client).
#
#   deploy/smoke.sh        PYTHON: a Python with kafka-python (default .venv/bin/python, else python3)
#                          IMAGE: the tag to build (default kcoord:smoke)
#                          DOCKER_BUILD_ARGS: more `docker build` arguments (e.g. --no-cache)
set -euo pipefail

cd "$(dirname "$0")/.."
image=${IMAGE:-kcoord:smoke}
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
run_id="kcoord-smoke-$$"
volume="$run_id-data"
acked=$(mktemp /tmp/kcoord-smoke-acked.XXXXXX)
containers=()
committer=
started=$SECONDS

say() { printf 'smoke [%3ds] %s\n' "$((SECONDS - started))" "$*"; }
fail() {
    say "FAILED: $*"
    for c in "${containers[@]}"; do
        echo "----- docker logs $c (last 40 lines)"
        docker logs --tail 40 "$c" 2>&1 || true
    done
    exit 1
}
cleanup() {
    if [ -n "$committer" ]; then kill "$committer" 2>/dev/null || true; fi
    for c in "${containers[@]}"; do docker rm --force --volumes "$c" >/dev/null 2>&1 || true; done
    docker volume rm --force "$volume" >/dev/null 2>&1 || true
    rm -f "$acked"
    if [ "${KEEP_IMAGE:-1}" = 0 ]; then docker image rm --force "$image" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_http URL SECONDS: GET until it answers 200; prints the status and body
wait_http() {
    "$python" - "$1" "$2" <<'PY'
import sys, time, urllib.error, urllib.request
url, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            print(resp.status, resp.read().decode().strip())
            break
    except (OSError, urllib.error.URLError) as err:
        if time.monotonic() > deadline:
            sys.exit(f"{url}: not 200 in time: {err}")
        time.sleep(0.2)
PY
}

# run_kcoord NAME: a detached container on the host network, loopback ports, the smoke volume, locked
# down as deploy/k8s runs it (read-only root file system, no capabilities, no privilege escalation).
# The image's HEALTHCHECK command runs every second here (15 s in the image) so the smoke need not wait.
run_kcoord() {
    containers+=("$1")
    docker run --detach --name "$1" --network host \
        --read-only --cap-drop ALL --security-opt no-new-privileges \
        --volume "$volume:/var/lib/kcoord" \
        --env KCOORD_LISTEN="127.0.0.1:$port" \
        --env KCOORD_ADVERTISED_LISTENER="127.0.0.1:$port" \
        --env KCOORD_METRICS_LISTEN="127.0.0.1:$metrics_port" \
        --health-interval 1s --health-start-period 60s \
        "$image" >/dev/null
}

# stop_kcoord NAME: SIGTERM through `docker stop`; the exit code and the log must say it stopped cleanly
stop_kcoord() {
    docker stop --time 30 "$1" >/dev/null
    local code logs stopped
    code=$(docker inspect --format '{{.State.ExitCode}}' "$1")
    [ "$code" = 0 ] || fail "$1 exited with $code after SIGTERM"
    logs=$(docker logs "$1" 2>&1)
    grep -q "signal received: stopping" <<<"$logs" || fail "$1: no 'signal received' log line"
    stopped=$(grep "kcoord stopped" <<<"$logs" || true)
    [ -n "$stopped" ] || fail "$1: no 'kcoord stopped' log line"
    case "$stopped" in *"not answered"*) fail "$1: $stopped" ;; esac
    say "docker stop $1: exit code $code; log: ${stopped#* INFO }"
}

docker info >/dev/null 2>&1 || { echo "smoke: no Docker daemon reachable (docker info failed)" >&2; exit 2; }
"$python" -c 'import kafka' 2>/dev/null || { echo "smoke: $python has no kafka-python" >&2; exit 2; }
base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)
docker image inspect "$base" >/dev/null 2>&1 \
    || { echo "smoke: base image $base is missing: build it with deploy/base-image.sh" >&2; exit 2; }

say "building $image from Dockerfile (base $base)"
# The legacy builder: this Docker client has no buildx plugin. --network host: the build stage's pip
# reaches PyPI without a bridge network.
# shellcheck disable=SC2086
DOCKER_BUILDKIT=0 docker build --quiet --force-rm --network host ${DOCKER_BUILD_ARGS:-} --tag "$image" . \
    2>&1 | grep -v -E 'DEPRECATED|BuildKit|environment-variable|^ *$' || true
docker image inspect "$image" >/dev/null 2>&1 || fail "docker build produced no $image"
size=$(docker image inspect --format '{{.Size}}' "$image")
say "built $image: $((size / 1000000)) MB, user $(docker image inspect --format '{{.Config.User}}' "$image")"

port=$(free_port)
metrics_port=$(free_port)
docker volume create "$volume" >/dev/null
run_kcoord "$run_id-1"
say "started $run_id-1: clients on 127.0.0.1:$port, metrics on 127.0.0.1:$metrics_port, volume $volume"
say "readyz: $(wait_http "http://127.0.0.1:$metrics_port/readyz" 60)"
health=
for _ in $(seq 1 60); do
    health=$(docker inspect --format '{{.State.Health.Status}}' "$run_id-1")
    [ "$health" = healthy ] && break
    sleep 0.5
done
[ "$health" = healthy ] || fail "Docker HEALTHCHECK status is $health"
say "docker HEALTHCHECK: $health"
uid=$(docker exec "$run_id-1" id -u)
[ "$uid" != 0 ] || fail "kcoord runs as root"
starting=$(docker logs "$run_id-1" 2>&1 | grep 'starting kcoord' || true)
grep -q "on uvloop" <<<"$starting" || fail "kcoord does not run on uvloop"
say "runs as uid $uid; log: ${starting#* INFO }"

"$python" - "$port" "$metrics_port" <<'PY' || fail "commit and read back"
import sys, urllib.request
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
port, metrics_port = sys.argv[1], sys.argv[2]
consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", group_id="smoke", enable_auto_commit=False)
wanted = {TopicPartition("smoke-events", p): 1000 + p for p in range(3)}
consumer.commit({tp: OffsetAndMetadata(offset, "smoke", -1) for tp, offset in wanted.items()})
got = {tp: consumer.committed(tp) for tp in wanted}
consumer.close()
assert got == wanted, got
text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
commits = [line for line in text.splitlines() if line.startswith("kcoord_offset_commits_total ")]
assert commits == ["kcoord_offset_commits_total 3.0"], commits
print("smoke: committed and read back", {f"{tp.topic}-{tp.partition}": o for tp, o in got.items()}, "|", commits[0])
PY

# A client committing offset 1, 2, 3, ... one at a time, appending each acknowledged offset to $acked,
# until its coordinator goes away (or 60 s pass).
"$python" - "$port" "$acked" <<'PY' &
import sys, time
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{sys.argv[1]}", group_id="smoke-stream",
                         enable_auto_commit=False)
tp, deadline = TopicPartition("smoke-stream", 0), time.monotonic() + 60
with open(sys.argv[2], "a") as acked:
    for offset in range(1, 1_000_000):
        try:
            consumer.commit({tp: OffsetAndMetadata(offset, "", -1)}, timeout_ms=2000)
        except Exception:
            break
        print(offset, file=acked, flush=True)
        if time.monotonic() > deadline:
            break
consumer.close(timeout_ms=1000)
PY
committer=$!
for _ in $(seq 1 100); do
    [ "$(wc -l <"$acked")" -ge 50 ] && break
    sleep 0.1
done
[ "$(wc -l <"$acked")" -ge 50 ] || fail "the committing client got fewer than 50 commits acknowledged"
stop_kcoord "$run_id-1"
wait "$committer" || true
committer=
last_acked=$(tail -n 1 "$acked")
say "commits in flight during the stop: $(wc -l <"$acked") acknowledged, the last one offset $last_acked"

run_kcoord "$run_id-2"
say "restarted as $run_id-2 on the same volume; readyz: $(wait_http "http://127.0.0.1:$metrics_port/readyz" 60)"
"$python" - "$port" "$last_acked" <<'PY' || fail "offsets after the restart"
import sys
from kafka import KafkaConsumer, TopicPartition
bootstrap, last_acked = f"127.0.0.1:{sys.argv[1]}", int(sys.argv[2])
consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="smoke", enable_auto_commit=False)
got = {p: consumer.committed(TopicPartition("smoke-events", p), metadata=True) for p in range(3)}
consumer.close()
assert all(got[p].offset == 1000 + p and got[p].metadata == "smoke" for p in got), got
print("smoke: after the restart, smoke-events", {p: (m.offset, m.metadata) for p, m in got.items()})
# The last acknowledged commit is durable; one more may be too (made durable, its reply never sent).
consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="smoke-stream", enable_auto_commit=False)
stream = consumer.committed(TopicPartition("smoke-stream", 0))
consumer.close()
assert stream in (last_acked, last_acked + 1), (stream, last_acked)
print(f"smoke: after the restart, smoke-stream is at {stream} (last acknowledged {last_acked}): nothing lost")
PY
stop_kcoord "$run_id-2"
say "PASSED"
