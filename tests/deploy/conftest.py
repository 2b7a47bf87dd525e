"""Fixtures of the deployment tests: the outside tools (tests/deploy/tools.py) and the deploy/ files."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import tools
from tests.kcoord_process import REPO

DEPLOY = REPO / "deploy"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


@pytest.fixture(scope="session")
def promtool() -> str:
    return tools.promtool()


@pytest.fixture(scope="session")
def prometheus() -> str:
    return tools.prometheus()
