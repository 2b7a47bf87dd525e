"""The history chart (pipeline/chart.py): every group's line is visible and the time axis spans the
log, also when all of it falls into one bucket."""

from datetime import UTC, datetime

import matplotlib.dates as mdates
import matplotlib.pyplot as plt

from pipeline.chart import figure, render

T = 1_700_000_040_000


def test_a_log_within_one_bucket_still_draws_its_groups_over_minutes_not_years() -> None:
    """One bucket drew an empty top panel (a step of one point has no length) over an axis from 2025 to
    2029 (a fault campaign's find)."""
    fig = figure([("a", T, 5), ("b", T, 3)], 1000)
    try:
        total_ax = fig.axes[0]
        assert all(line.get_marker() not in (None, "None", "") for line in total_ax.get_lines())
        low, high = (mdates.num2date(x) for x in total_ax.get_xlim())  # type: ignore[no-untyped-call]
        assert low <= datetime.fromtimestamp(T / 1000, UTC) and (high - low).total_seconds() < 60
    finally:
        plt.close(fig)


def test_a_longer_log_draws_lines_over_its_span() -> None:
    points = [("a", T + i * 1000, i) for i in range(30)]
    fig = figure(points, 1000)
    try:
        (line,) = fig.axes[0].get_lines()
        assert line.get_marker() in (None, "None", "") and len(line.get_xdata()) == 30
    finally:
        plt.close(fig)
    assert render(points, 1000).startswith(b"\x89PNG")
