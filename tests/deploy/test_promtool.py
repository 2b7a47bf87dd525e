"""promtool on deploy/prometheus: the scrape configuration, the alert rules and their unit tests
(alerts_test.yml). The same files run in a real Prometheus in test_prometheus.py."""

import subprocess
from pathlib import Path

from tests.deploy.conftest import DEPLOY

PROM = DEPLOY / "prometheus"


def promtool_run(promtool: str, *args: str, cwd: Path = PROM) -> str:
    result = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_check_config(promtool: str) -> None:
    out = promtool_run(promtool, "check", "config", "prometheus.yml")
    assert "SUCCESS: prometheus.yml is valid prometheus config file syntax" in out
    assert "SUCCESS: 19 rules found" in out  # it follows rule_files to alerts.yml


def test_check_rules(promtool: str) -> None:
    assert "SUCCESS: 19 rules found" in promtool_run(promtool, "check", "rules", "alerts.yml")


def test_alert_rule_unit_tests(promtool: str) -> None:
    assert "SUCCESS" in promtool_run(promtool, "test", "rules", "alerts_test.yml")


def test_rule_unit_tests_can_fail(promtool: str, tmp_path: Path) -> None:
    """The unit tests compare labels, annotations and timing: a rule whose `for` changes fails them."""
    (tmp_path / "alerts.yml").write_text((PROM / "alerts.yml").read_text().replace("for: 1m", "for: 3m", 1))
    (tmp_path / "alerts_test.yml").write_text((PROM / "alerts_test.yml").read_text())
    result = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "alertname: KcoordDown, time: 4m" in result.stdout + result.stderr
