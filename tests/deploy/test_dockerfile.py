"""The top-level Dockerfile: hadolint finds nothing, the image keeps what operators rely on (non-root,
volume, ports, healthcheck, stop signal, env defaults), and the two helpers it ships work: the
HEALTHCHECK command against a real kcoord, and the entrypoint's advertised-listener default."""

import http.server
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.config import is_wildcard, parse_host_port
from tests.deploy import tools
from tests.deploy.conftest import DEPLOY
from tests.integration.test_supervisor import Supervised
from tests.kcoord_process import REPO, KcoordProcess, free_port

DOCKERFILE = REPO / "Dockerfile"
HEALTHCHECK = DEPLOY / "docker" / "healthcheck.py"
ENTRYPOINT = DEPLOY / "docker" / "entrypoint.sh"


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tools.hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=120)


def test_hadolint_finds_nothing() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr
    assert "hadolint ignore" not in DOCKERFILE.read_text()


def test_hadolint_does_lint(tmp_path: Path) -> None:
    """Not a linter that passes everything: a careless Dockerfile gets the findings it deserves."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get update && apt-get install -y curl\nRUN cd /tmp\n")
    result = hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3015", "DL3003"):  # latest tag, unpinned, recommends, cd
        assert rule in result.stdout


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                                             if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in text.splitlines() if line.strip()]


def test_the_image_keeps_its_operational_contract() -> None:
    got = instructions()
    froms = [args for ins, args in got if ins == "FROM"]
    assert len(froms) == 2 and froms[0].endswith(" AS build"), froms  # multi-stage
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm") in got
    runtime = got[[ins for ins, _ in got].index("FROM", 1):]
    user = next(args for ins, args in runtime if ins == "USER")
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), user  # numeric, not root (runAsNonRoot can check it)
    assert ("VOLUME", '["/var/lib/kcoord"]') in runtime
    assert ("EXPOSE", "9092 9404") in runtime
    assert ("STOPSIGNAL", "SIGTERM") in runtime
    health = next(args for ins, args in runtime if ins == "HEALTHCHECK")
    assert "--start-period=" in health and "kcoord-healthcheck" in health
    env = " ".join(args for ins, args in runtime if ins == "ENV")
    for default in ("KCOORD_LISTEN=0.0.0.0:9092", "KCOORD_METRICS_LISTEN=0.0.0.0:9404",
                    "KCOORD_DATA_DIR=/var/lib/kcoord"):
        assert default in env
    build = " ".join(args for ins, args in got if ins == "RUN")
    assert "import uvloop" in build  # the build fails when uvloop is not installed
    assert "COPY --from=build /opt/kcoord /opt/kcoord" in " ".join(f"{i} {a}" for i, a in runtime)


# Above the kernel's PID_MAX_LIMIT (2^22): no process has it, so the healthcheck reads its own environment
NO_PROCESS = str((1 << 22) + 1)


def healthcheck(listen: str, **more: str) -> subprocess.CompletedProcess[str]:
    """The healthcheck as set up by its environment. Not PID 1's: on a test host, any ``kcoord serve``
    whose parent died was reparented to PID 1, and the healthcheck asked that one (another test run's, or
    another user's server) instead of ``listen``."""
    env = dict(os.environ, KCOORD_METRICS_LISTEN=listen, KCOORD_HEALTHCHECK_PID=NO_PROCESS, **more)
    return subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=30)


def test_healthcheck_follows_readyz_of_a_real_kcoord(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data").start()
    try:
        ready = healthcheck(f"0.0.0.0:{server.metrics_port}")  # a wildcard is asked on loopback
        assert ready.returncode == 0 and '"status": "ready"' in ready.stdout, ready.stdout
    finally:
        assert server.stop() == 0
    gone = healthcheck(f"127.0.0.1:{server.metrics_port}")
    assert gone.returncode == 1 and "Connection refused" in gone.stdout, gone.stdout



def test_healthcheck_asks_every_node_of_processes_and_names_the_one_not_ready(tmp_path: Path) -> None:
    """``KCOORD_PROCESSES=2`` in the image runs two nodes, node i's metrics on the port + i. Only node 0
    was asked: with node 1 unable to answer (stopped here, as a hung node would be), half of the groups
    went unserved while the container reported healthy."""
    supervised = Supervised(tmp_path).start()
    node1 = int(re.findall(r"node-1 kcoord: starting kcoord .* \(pid (\d+)\)", supervised.log())[-1])
    try:
        os.kill(node1, signal.SIGSTOP)
        try:
            hung = healthcheck(f"0.0.0.0:{supervised.metrics}", KCOORD_PROCESSES="2", KCOORD_HEALTHCHECK_TIMEOUT_S="1")
        finally:
            os.kill(node1, signal.SIGCONT)
        assert hung.returncode == 1, hung.stdout
        assert "not ready: node 1 of 2" in hung.stdout and f":{supervised.metrics + 1}/readyz" in hung.stdout, \
            hung.stdout
        assert hung.stdout.count('"status": "ready"') == 1, hung.stdout  # node 0's answer, still shown
        ready = healthcheck(f"0.0.0.0:{supervised.metrics}", KCOORD_PROCESSES="2")
        assert ready.returncode == 0, ready.stdout
        assert [line.split(":", 1)[0] for line in ready.stdout.splitlines()] == ["node 0", "node 1"], ready.stdout
        assert ready.stdout.count('"status": "ready"') == 2, ready.stdout
    finally:
        assert supervised.proc is not None
        supervised.proc.terminate()
        assert supervised.proc.wait(30) == 0

def test_healthcheck_reads_the_running_kcoords_flags(tmp_path: Path) -> None:
    """``docker run IMAGE serve --processes 2 --metrics-listen ...``: the settings are flags of kcoord (PID 1
    in the container), not variables the healthcheck sees; it asked node 0 of the default listener only.
    Here the running kcoord is named by KCOORD_HEALTHCHECK_PID and the healthcheck's own environment says
    nothing (KCOORD_PROCESSES unset, KCOORD_METRICS_LISTEN another port)."""
    supervised = Supervised(tmp_path).start()
    assert supervised.proc is not None
    node1 = int(re.findall(r"node-1 kcoord: starting kcoord .* \(pid (\d+)\)", supervised.log())[-1])
    unrelated = {k: v for k, v in os.environ.items() if not k.startswith("KCOORD_")}

    def check(pid: int) -> subprocess.CompletedProcess[str]:
        env = dict(unrelated, KCOORD_HEALTHCHECK_PID=str(pid), KCOORD_METRICS_LISTEN="127.0.0.1:1",
                   KCOORD_HEALTHCHECK_TIMEOUT_S="1")
        return subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, capture_output=True, text=True,
                              timeout=30)

    try:
        ready = check(supervised.proc.pid)
        assert ready.returncode == 0, ready.stdout + ready.stderr
        assert [line.split(":", 1)[0] for line in ready.stdout.splitlines()] == ["node 0", "node 1"], ready.stdout
        assert f":{supervised.metrics + 1}/readyz" not in ready.stdout and ready.stdout.count('"ready"') == 2
        os.kill(node1, signal.SIGSTOP)
        try:
            hung = check(supervised.proc.pid)
        finally:
            os.kill(node1, signal.SIGCONT)
        assert hung.returncode == 1 and "not ready: node 1 of 2" in hung.stdout, hung.stdout
        assert f":{supervised.metrics + 1}/readyz" in hung.stdout, hung.stdout
        with subprocess.Popen(["sleep", "30"]) as sleeper:  # not a `kcoord serve`: its own environment, port 1
            other = check(sleeper.pid)
            sleeper.kill()
        assert other.returncode == 1 and "127.0.0.1:1/readyz" in other.stdout, other.stdout
    finally:
        supervised.proc.terminate()
        assert supervised.proc.wait(30) == 0


def test_healthcheck_finds_kcoord_under_an_init_and_skips_a_port_of_the_systems_choosing() -> None:
    """``docker run --init``: PID 1 is docker-init (or tini) and kcoord its child. It parsed the init's
    command line (any ``serve`` in it) and environment, lost the flags and asked node 0 of the default
    listener; a ``--metrics-listen`` port 0 (each node's port the system's choice) was asked as ports 0..N-1,
    unhealthy for good. Stand-ins: a shell as the init, a sleeping process with kcoord's command line."""
    closed = free_port()

    def under_init(*flags: str) -> subprocess.CompletedProcess[str]:
        child = shlex.join([sys.executable, "-c", "import time; time.sleep(60)", "kcoord", "serve", *flags])
        init = subprocess.Popen(["sh", "-c", f"{child} & wait"])
        try:
            deadline = time.monotonic() + 10
            while not Path(f"/proc/{init.pid}/task/{init.pid}/children").read_text().split():
                assert time.monotonic() < deadline
                time.sleep(0.01)
            env = {k: v for k, v in os.environ.items() if not k.startswith("KCOORD_")}
            return subprocess.run([sys.executable, str(HEALTHCHECK)], capture_output=True, text=True, timeout=30,
                                  env=dict(env, KCOORD_HEALTHCHECK_PID=str(init.pid), KCOORD_HEALTHCHECK_TIMEOUT_S="1"))
        finally:
            for pid in Path(f"/proc/{init.pid}/task/{init.pid}/children").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
            init.wait(10)

    asked = under_init("--processes", "2", "--metrics-listen", f"127.0.0.1:{closed}")
    assert asked.returncode == 1 and "not ready: nodes 0, 1 of 2" in asked.stdout, asked.stdout
    assert f"127.0.0.1:{closed + 1}/readyz" in asked.stdout, asked.stdout  # the child's flags, not the defaults
    chosen = under_init("--processes", "2", "--metrics-listen", "127.0.0.1:0")
    assert chosen.returncode == 0 and "nothing to check" in chosen.stdout, chosen.stdout


@pytest.fixture
def unready_listener() -> Iterator[int]:
    """An HTTP server answering /readyz as kcoord does while partitions load."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"status": "not ready", "loading": [3]}'
            self.send_response(503 if self.path == "/readyz" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def test_healthcheck_fails_while_not_ready_and_passes_with_metrics_off(unready_listener: int) -> None:
    unready = healthcheck(f"127.0.0.1:{unready_listener}")
    assert unready.returncode == 1 and '503 {"status": "not ready", "loading": [3]}' in unready.stdout
    for word in ("off", "none", "disabled"):  # kcoord's words for no metrics listener
        off = healthcheck(word, KCOORD_PROCESSES="2")
        assert off.returncode == 0 and "nothing to check" in off.stdout, off.stdout


def entrypoint(tmp_path: Path, **env: str) -> str:
    """Runs the entrypoint with a stand-in ``kcoord`` on PATH that prints what it was given."""
    fake = tmp_path / "bin" / "kcoord"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\necho "args=$* advertised=${KCOORD_ADVERTISED_LISTENER:-unset}"\n')
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KCOORD_")}
    full = dict(base, PATH=f"{fake.parent}:{os.environ['PATH']}", **env)
    result = subprocess.run(["sh", str(ENTRYPOINT), "serve", "--log-level", "DEBUG"], env=full,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_entrypoint_advertises_the_hostname_only_for_a_wildcard_listener(tmp_path: Path) -> None:
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    port = free_port()
    assert entrypoint(tmp_path, KCOORD_LISTEN=f"0.0.0.0:{port}") == \
        f"args=serve --log-level DEBUG advertised={hostname}:{port}"
    assert entrypoint(tmp_path, KCOORD_LISTEN="[::]:9092").endswith(f"advertised={hostname}:9092")
    assert entrypoint(tmp_path, KCOORD_LISTEN="0.0.0.0:9092", KCOORD_ADVERTISED_LISTENER="kc.example:19092") \
        .endswith("advertised=kc.example:19092")
    assert entrypoint(tmp_path, KCOORD_LISTEN="127.0.0.1:9092").endswith("advertised=unset")


def test_entrypoint_leaves_a_cluster_node_advertising_its_cluster_entry(tmp_path: Path) -> None:
    """Cluster mode in the image (KCOORD_LISTEN=0.0.0.0:9092, its default, and KCOORD_CLUSTER /
    KCOORD_NODE_ID): the node advertises its --cluster entry (README, Cluster mode). The entrypoint's
    hostname default for KCOORD_ADVERTISED_LISTENER must not then make kcoord refuse to start because
    the two differ ("give one of them": the user gave one)."""
    fake = tmp_path / "bin" / "kcoord"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'from coordinator.config import config_from_args, "
                    "add_serve_arguments; import argparse; p = argparse.ArgumentParser(); add_serve_arguments(p); "
                    "print(config_from_args(p.parse_args([])).advertised)'\n")
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KCOORD_")}
    env = dict(base, PATH=f"{fake.parent}:{os.environ['PATH']}", PYTHONPATH=str(REPO), KCOORD_LISTEN="0.0.0.0:9092",
               KCOORD_CLUSTER="0@kcoord-0.example:9092,1@kcoord-1.example:9092", KCOORD_NODE_ID="1")
    result = subprocess.run(["sh", str(ENTRYPOINT), "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-600:]
    assert result.stdout.strip() == "('kcoord-1.example', 9092)"


@pytest.mark.parametrize("args", [["--cluster", ""], ["--cluster="], ["--cluster", "none"],
                                  ["--cluster", "0@kc-0.example:9092", "--cluster", ""],
                                  ["--clu", ""], ["--cl="]])  # argparse takes any unambiguous prefix
def test_entrypoint_advertises_the_hostname_when_a_flag_undoes_the_environments_cluster(
        tmp_path: Path, args: list[str]) -> None:
    """``--cluster ''`` (kcoord: one node, whatever KCOORD_CLUSTER says) makes the node a standalone one,
    which needs the entrypoint's advertised default on the image's wildcard listener, or kcoord refuses
    to start; the last --cluster given is the one kcoord reads."""
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    fake = tmp_path / "bin" / "kcoord"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "advertised=${KCOORD_ADVERTISED_LISTENER:-unset}"\n')
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KCOORD_")}
    env = dict(base, PATH=f"{fake.parent}:{os.environ['PATH']}", KCOORD_LISTEN="0.0.0.0:9092",
               KCOORD_CLUSTER="0@kc-0.example:9092,1@kc-1.example:9092")
    result = subprocess.run(["sh", str(ENTRYPOINT), "serve", *args], env=env, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"advertised={hostname}:9092"
    kept = subprocess.run(["sh", str(ENTRYPOINT), "serve", "--cluster", "", "--cluster", "0@kc-0.example:9092"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert kept.stdout.strip() == "advertised=unset"


def test_healthcheck_asks_every_node_at_once_however_many(tmp_path: Path) -> None:
    """--processes goes up to 1024 nodes, and the script says the check takes one timeout however many
    they are (Docker's --timeout=5s bounds it, the per-node timeout is 4 s): 33 nodes that do not
    answer took two rounds of the timeout through a pool of 32, and Docker killed the check before
    it named them. Told by order, not by a clock: the last node is asked while the check still holds
    every other node's connection open, waiting for its answer. The check's own timeout is set far beyond
    the test (the test ends the asks itself, by closing them), so no stall of this process, however long,
    can make a check that asks at once look like one that gave up on the first nodes; asked in rounds,
    the last node is never asked while the others are held, and its accept times out."""
    nodes = 33
    for _ in range(50):  # 33 consecutive ports that accept connections and never answer
        listeners: list[socket.socket] = []
        first = free_port()
        try:
            for i in range(nodes):
                s = socket.socket()
                listeners.append(s)
                s.bind(("127.0.0.1", first + i))
                s.listen(4)
            break
        except OSError:
            for s in listeners:
                s.close()
    else:
        pytest.skip("no 33 consecutive free ports")
    env = dict(os.environ, KCOORD_METRICS_LISTEN=f"127.0.0.1:{first}", KCOORD_HEALTHCHECK_PID=NO_PROCESS,
               KCOORD_PROCESSES=str(nodes), KCOORD_HEALTHCHECK_TIMEOUT_S="600")  # never reached: closed below
    check = subprocess.Popen([sys.executable, str(HEALTHCHECK)], env=env, stdout=subprocess.PIPE, text=True)
    asked: list[socket.socket] = []
    try:
        for i, listener in enumerate(listeners):
            listener.settimeout(30)
            try:
                asked.append(listener.accept()[0])
            except TimeoutError:
                pytest.fail(f"node {i} was not asked while nodes {list(range(i))} were held waiting: asked in rounds")
        given_up = [i for i, conn in enumerate(asked[:-1]) if _closed_by_peer(conn)]
        for conn in asked:  # every node hangs up unanswered: each ask fails at once
            conn.close()
        out, _ = check.communicate(timeout=30)
    finally:
        check.kill()
        for s in listeners + asked:
            s.close()
    assert not given_up, f"nodes {given_up} were given up on before node {nodes - 1} was asked: asked in rounds"
    assert check.returncode == 1 and f"not ready: nodes {', '.join(map(str, range(nodes)))} of {nodes}" in out


def _closed_by_peer(conn: socket.socket) -> bool:
    """Whether the other end has closed ``conn``, reading past any request it sent first."""
    while True:
        try:
            if not conn.recv(65536, socket.MSG_DONTWAIT):
                return True
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True


@pytest.mark.parametrize(("args", "advertised"), [
    (["--listen", "0.0.0.0:9000"], "HOSTNAME:9000"),
    (["--listen=[::]:9100"], "HOSTNAME:9100"),
    (["--lis", "0.0.0.0:9200"], "HOSTNAME:9200"),  # argparse takes any unambiguous prefix
    (["--listen", "0.0.0.0:9000", "--listen", "127.0.0.1:9001"], "127.0.0.1:9001"),  # the last one given
    (["--listen", "127.0.0.1:9000"], "127.0.0.1:9000"),
    # the IPv4 shorthands kcoord reads as 0.0.0.0 (it refused them: a wildcard without an advertised listener)
    (["--listen", "0:9300"], "HOSTNAME:9300"),
    (["--listen", "0.0:9301"], "HOSTNAME:9301"),
    (["--listen", "0x0.00.0:9302"], "HOSTNAME:9302"),
    (["--listen", "[::ffff:0.0.0.0]:9303"], "HOSTNAME:9303"),
    (["--listen", "00.1:9304"], "00.1:9304"),  # 0.0.0.1, no wildcard
    (["--listen", "0x:9305"], "0x:9305"),  # a name
    (["--listen", "0.0.0.0.0:9306"], "0.0.0.0.0:9306"),  # five parts: a name
    # IPv6 spellings of a wildcard beyond [::]: the groups read in place, as kcoord reads them
    (["--listen", "[0::0]:9307"], "HOSTNAME:9307"),
    (["--listen", "[::0.0.0.0]:9308"], "HOSTNAME:9308"),
    (["--listen", "[::FFFF:0:0]:9309"], "HOSTNAME:9309"),  # 0.0.0.0 mapped, in hex
    (["--listen", "[0:0:0:0:0:0:0:0]:9310"], "HOSTNAME:9310"),
    (["--listen", "[::ffff:0]:9311"], "::ffff:0:9311"),  # ::255.255.0.0, no wildcard
    (["--listen", "[0:ffff::]:9312"], "0:ffff:::9312"),
    (["--listen", "[::1]:9313"], "::1:9313"),
    # kcoord reads a zone as the address (::%eth0 is ::) and a bracketed IPv4 address without its brackets:
    # wildcards there, so a default is needed as for 0.0.0.0
    (["--listen", "[::%eth0]:9314"], "HOSTNAME:9314"),
    (["--listen", "[::ffff:0.0.0.0%eth0]:9315"], "HOSTNAME:9315"),
    (["--listen", "[0.0.0.0]:9316"], "HOSTNAME:9316"),
    (["--listen", "[0]:9317"], "HOSTNAME:9317"),
    (["--listen", "[::1%lo]:9318"], "::1%lo:9318"),
    # a listener URL is read as the HOST:PORT after its "://", as Kafka's listeners=PLAINTEXT://0.0.0.0:9092
    (["--listen", "PLAINTEXT://0.0.0.0:9319"], "HOSTNAME:9319"),
    (["--listen", "PLAINTEXT://[::]:9320"], "HOSTNAME:9320"),
    (["--listen", "PLAINTEXT://127.0.0.1:9321"], "127.0.0.1:9321"),
])
def test_entrypoint_advertises_the_port_of_a_listen_flag(tmp_path: Path, args: list[str], advertised: str) -> None:
    """``docker run IMAGE serve --listen 0.0.0.0:9000``: kcoord listens where the flag says, over the image's
    KCOORD_LISTEN=0.0.0.0:9092, but the entrypoint made its advertised default of the variable's port
    (clients were sent to port 9092, where nothing listens), and gave one to a loopback --listen too."""
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    fake = tmp_path / "bin" / "kcoord"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nshift\nexec {sys.executable} -c 'import argparse, sys; from coordinator.config import "
                    "config_from_args, add_serve_arguments; p = argparse.ArgumentParser(); add_serve_arguments(p); "
                    "print(\"%s:%d\" % config_from_args(p.parse_args(sys.argv[1:])).advertised)' \"$@\"\n")
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KCOORD_")}
    env = dict(base, PATH=f"{fake.parent}:{os.environ['PATH']}", PYTHONPATH=str(REPO), KCOORD_LISTEN="0.0.0.0:9092")
    result = subprocess.run(["sh", str(ENTRYPOINT), "serve", *args], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr[-600:]
    assert result.stdout.strip() == advertised.replace("HOSTNAME", hostname)


WILDCARD_SPELLINGS = [
    "0.0.0.0", "0", "0x0.00", "[::]", "[0::0]", "[::0.0.0.0]", "[::FFFF:0:0]", "[0:0:0:0:0:ffff:0.0.0.0]",
    "[0000:0000:0000:0000:0000:0000:0000:0000]", "[::%eth0]", "[0::0%1]", "[::ffff:0.0.0.0%eth0]", "[0.0.0.0]", "[0]",
    "PLAINTEXT://0.0.0.0", "PLAINTEXT://[::]", "SSL://[0.0.0.0]",
]
OTHER_SPELLINGS = [
    "127.0.0.1", "0.0.0.1", "kcoord.example", "[::1]", "[::ffff:0]", "[0:ffff::]", "[::0.0.0.1]", "[::0.0.0]",
    "[::ffff:0.0.0.00]", "[00000::]", "[:::]", "[0:0:0:0:0:0:0:0:0]", "[0:0:0:0:0:0:0]", "[::%]", "[::%a%b]",
    "[::1%eth0]", "[0%eth0]", "[*]", "[::*]", "[::?]", "[:: ]", "[%eth0]", "[127.0.0.1]", "PLAINTEXT://127.0.0.1",
    "x://y://0.0.0.0",
]


def test_the_entrypoints_wildcard_is_kcoords(tmp_path: Path) -> None:
    """The entrypoint gives its hostname default exactly for the listeners kcoord takes for a wildcard (and
    refuses to start with alone): its own reading of the spellings, in the image's /bin/sh, agrees with
    kcoord's on each."""
    fake = tmp_path / "bin" / "kcoord"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "${KCOORD_ADVERTISED_LISTENER:-unset}"\n')
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KCOORD_")}
    env = dict(base, PATH=f"{fake.parent}:{os.environ['PATH']}")
    wrong = []
    for host in WILDCARD_SPELLINGS + OTHER_SPELLINGS:
        listen = f"{host}:9092"
        kcoord = is_wildcard(parse_host_port(listen)[0])
        assert kcoord == (host in WILDCARD_SPELLINGS), host
        result = subprocess.run(["sh", str(ENTRYPOINT), "serve"], env=dict(env, KCOORD_LISTEN=listen),
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        if (result.stdout.strip() != "unset") != kcoord:
            wrong.append(host)
    assert not wrong, f"the entrypoint reads these otherwise than kcoord: {wrong}"
