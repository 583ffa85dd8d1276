"""The test-time compute panel of a group's plot (trm/analysis/plots.py): test accuracy against the forward FLOPs
spent on one puzzle at test time, one curve per member (a training configuration, its runs averaged).

A member's points are its deterministic ones (each test_time_steps count: circles, from TABLE-test-time.csv) and
its sampled ones (each count x K trajectories, the answer the Q head picks: triangles, from TABLE-sampled.csv),
each at its `flops_per_puzzle` (steps x K x one supervision step's forward FLOPs; trm aggregate). The curve joins
the best accuracy the member reaches at or below each FLOP count: where one member's curve lies above another's at
the same FLOPs, it reaches that accuracy more cheaply at test time, whatever it spent in training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trm.study.metrics import TEST_TIME_FLOPS, TEST_TIME_METRICS

if TYPE_CHECKING:
    import pandas as pd

FALLBACK_TITLE = "exact accuracy 0 for every run: cell accuracy shown"


def compute_panel(ax, group: dict, test_time: pd.DataFrame, sampled: pd.DataFrame) -> None:
    """Draw the panel on `ax` for `group`'s members, from every group's test-time and sampled rows."""
    import pandas as pd

    x = TEST_TIME_FLOPS.key
    ax.set_title("accuracy vs test-time FLOPs per puzzle", fontsize="medium")
    plain = test_time[test_time["id"].isin(group["members"])]
    noisy = sampled[sampled["id"].isin(group["members"])]
    exact = not (
        (plain["exact_accuracy"].fillna(0) == 0).all() and (noisy["q_exact_accuracy"].fillna(0) == 0).all()
    )
    columns = ("exact_accuracy", "q_exact_accuracy") if exact else ("accuracy", "q_accuracy")
    if not exact:
        ax.set_title(f"{ax.get_title()}\n{FALLBACK_TITLE}", fontsize="medium")
    for member in group["members"]:
        # Each point the mean of the member's runs (seeds); the sampled ones keyed by K and count too, since two
        # of them can spend the same FLOPs (K = 2 at 16 steps, K = 1 at 32).
        points = [
            part[part["id"] == member].groupby([x, *keys])[y].mean().reset_index().rename(columns={y: "y"})
            for part, keys, y in (
                (plain, ["steps"], columns[0]),
                (noisy, ["steps", "trajectories"], columns[1]),
            )
        ]
        both = pd.concat(points).sort_values(x)
        if both.empty:
            continue
        is_base = member == group["baseline"]
        style = {"color": "black", "linewidth": 2.5} if is_base else {}
        (line,) = ax.plot(
            both[x],
            both["y"].cummax(),
            drawstyle="steps-post",
            label=f"{member}{' (baseline)' * is_base}",
            **style,
        )
        for part, marker in zip(points, ("o", "^"), strict=True):
            ax.scatter(part[x], part["y"], marker=marker, color=line.get_color(), s=18, zorder=3)
    ax.set_xscale("log")
    ax.set_xlabel(f"{TEST_TIME_FLOPS.axis_label}, log scale")
    metric = TEST_TIME_METRICS[columns[0]]
    ax.set_ylabel(f"{metric.label}, the best at or below these FLOPs ({metric.unit})")
    ax.grid(alpha=0.3)
    ax.scatter([], [], marker="o", color="tab:gray", label="one trajectory (test_time_steps)")
    ax.scatter([], [], marker="^", color="tab:gray", label="K noisy trajectories, the Q head's pick")
    ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
