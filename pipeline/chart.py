"""The history chart: offset advance over time of the busiest groups, as a PNG (matplotlib, no display).

Two panels share the time axis: the cumulative advance (how far each group's committed offsets moved
since the log begins) and the advance per second in each time bucket. Buckets are chosen so a log of
any length gets at most ~240 points per line."""

import io
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

NICE_BUCKETS_MS = [1_000 * s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600,
                                       43200, 86400, 7 * 86400)]
MAX_POINTS = 240


def bucket_ms(span_ms: int) -> int:
    """The smallest nice bucket that cuts ``span_ms`` into at most MAX_POINTS pieces."""
    for bucket in NICE_BUCKETS_MS:
        if span_ms / bucket <= MAX_POINTS:
            return bucket
    return NICE_BUCKETS_MS[-1]


def _label(bucket: int) -> str:
    return f"{bucket // 1000} s" if bucket < 60_000 else f"{bucket // 60_000} min"


def render(points: list[tuple[str, int, int]], bucket: int) -> bytes:
    """PNG bytes from (group, bucket start ms, advance in that bucket)."""
    import matplotlib.pyplot as plt

    fig = figure(points, bucket)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def figure(points: list[tuple[str, int, int]], bucket: int) -> Any:
    """The chart's matplotlib figure (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[int, int]] = defaultdict(dict)
    for group, start, advance in points:
        series[group][start] = advance
    order = sorted(series, key=lambda g: (-sum(series[g].values()), g))
    fig, (total_ax, rate_ax) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True,
                                            gridspec_kw={"height_ratios": [3, 2]})
    for group in order:
        starts = sorted(series[group])
        times = [datetime.fromtimestamp((s + bucket) / 1000, UTC) for s in starts]
        running, cumulative = 0, []
        for s in starts:
            running += series[group][s]
            cumulative.append(running)
        # a lone point is a step of no length: drawn as a marker, or the group's line is invisible
        total_ax.step(times, cumulative, where="post", label=group, linewidth=1.6,
                      marker="o" if len(times) == 1 else None)
        rate_ax.plot(times, [series[group][s] * 1000 / bucket for s in starts], marker=".", linewidth=1.0)
    title = f"Offset advance of the {len(order)} busiest groups" if order else "No offset advanced in this log"
    total_ax.set_title(title)
    total_ax.set_ylabel("committed offsets advanced\n(cumulative, all partitions)")
    rate_ax.set_ylabel(f"advance per second\n({_label(bucket)} buckets)")
    rate_ax.set_xlabel("commit time (UTC)")
    for ax in (total_ax, rate_ax):
        ax.grid(True, alpha=0.3)
    if order:
        total_ax.legend(loc="upper left", fontsize="small", title="group")
        buckets = {s for group in order for s in series[group]}
        if len(buckets) == 1:  # one bucket: matplotlib's default limits for a single date span years
            (only,) = buckets
            rate_ax.set_xlim(datetime.fromtimestamp(only / 1000, UTC),
                             datetime.fromtimestamp((only + 2 * bucket) / 1000, UTC))
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig
