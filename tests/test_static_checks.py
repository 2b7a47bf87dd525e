"""The type checker and linter are part of the suite: ``mypy --strict`` and ``ruff`` stay clean."""

import subprocess
import sys

import pytest

from tests.kcoord_process import REPO

CHECKS = {
    "mypy": [sys.executable, "-m", "mypy"],
    "ruff": [sys.executable, "-m", "ruff", "check", "coordinator", "protocol", "storage", "pipeline", "tests", "bench",
             "deploy"],
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_clean(name: str) -> None:
    result = subprocess.run(CHECKS[name], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
