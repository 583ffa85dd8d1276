"""Plot one experiment group: its main plots from config/groups.yaml, side by side, as PNG and SVG.

    trm plot-group exp01 --table results/smoke/table --groups config/groups.yaml --output results/smoke/plots/exp01

Reads TABLE.csv, TABLE-curves.csv, TABLE-test-time.csv and TABLE-sampled.csv (`trm aggregate`). Each panel is one `plots:` entry of
the group: `line` puts the members on x (a config key, a metric or `member`), `pareto` scatters them and draws the
front of runs no other run beats on both axes, `curve` draws test accuracy over training per member. Every run of
the group in the table is drawn, except those marked `floor_only` (in a selection's table only to measure the noise
floor, trm/study/selection.py). The group's baseline is drawn as a star (a thick black line for curves). A `line`
or `pareto` panel draws each experiment at its mean with its 95% interval from the table (`trm aggregate`: solid
over seeds, dashed where one run borrowed the noise floor or the test split's sampling interval), every run as a
small black dot, and n beside each experiment's id. A metric the runs did not measure is shown as an empty panel
saying so. A last panel, on every group, draws test exact
accuracy against the number of supervision steps at test time per member, from TABLE-test-time.csv (the training
job's final evaluation at the workflow's test_time_steps). A curve panel and the test-time panel draw each
experiment's mean line with its 95% interval as a shaded band (trm/analysis/bands.py: over seeds, or for one run the
noise floor at that epoch or step count with the sampling interval of the puzzles evaluated; a reference run's band
hatched), every run as a thin line, and n in the legend (with the interval's source where n = 1). Where the group's
runs sampled (test_time_trajectories), a last panel draws accuracy against test-time FLOPs per puzzle
(trm/analysis/compute_plot.py).

Where a panel's exact accuracy is 0 for every run of the group (short runs, e.g. the smoke scale), the panel draws
cell accuracy instead (the fraction of cells right) and its title says so: a flat line at 0 shows no trend.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import TYPE_CHECKING

from trm import storage
from trm.analysis.aggregate import (
    CURVE_COLUMNS,
    RUN_TABLE_COLUMNS,
    SAMPLED_COLUMNS,
    TEST_TIME_COLUMNS,
    read_table,
    selected_runs,
)
from trm.analysis.bands import point_estimates
from trm.analysis.compute_plot import FALLBACK_TITLE, compute_panel
from trm.analysis.uncertainty import SEEDS
from trm.errors import UserError
from trm.study.groups import REFERENCE_GROUP, load_groups
from trm.study.metrics import CELL_FALLBACK, CURVE_METRICS, PLOT_METRICS, TEST_TIME_METRICS, Metric

# pandas and matplotlib are imported where a plot is drawn: `trm plot-group --help` stays fast.
if TYPE_CHECKING:
    import pandas as pd

# Axis labels of what is not a metric (metrics: trm/study/metrics.py): the member axis and the config keys the groups
# plot against.
LABELS = {
    "member": "experiment",
    "data.train_puzzles": "training puzzles (count)",
    "data.num_aug": "augmentations per puzzle (count)",
    "train.global_batch_size": "global batch size (examples)",
}


def label(name: str) -> str:
    """The axis label of a metric of the table or the curves, a config key or `member`."""
    if name in LABELS:
        return LABELS[name]
    metric = PLOT_METRICS.get(name) or CURVE_METRICS.get(name)
    return metric.axis_label if metric else name


# Accuracies are fractions: an accuracy axis spans at least 5 points, so that a 0.1-point difference (0.7384 vs
# 0.7392) is drawn as the near-flat line it is, not as a cliff filling the panel.
MIN_ACCURACY_SPAN = 0.05


def _metric(points: pd.DataFrame, y: str, ax) -> str:
    """`y`, or its cell accuracy when `y` is an exact accuracy that is 0 (or unmeasured) for every row; the
    panel's title then says so."""
    fallback = CELL_FALLBACK.get(y)
    if fallback is None or not (points[y].fillna(0) == 0).all():
        return y
    title = ax.get_title()
    ax.set_title(f"{title}\n{FALLBACK_TITLE}" if title else FALLBACK_TITLE, fontsize="medium")
    return fallback


def _compact(value: float) -> str:
    """1480000 -> '1.48M', 250 -> '250': a tick label that stays short."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def _log_ticks(ax, values: pd.Series) -> None:
    """A log x axis ticked at the measured values, labelled compactly: matplotlib labels the minor ticks of an
    axis spanning a decade or two ('3x10^6', '4x10^6', ...), and those labels overlap."""
    from matplotlib.ticker import NullLocator

    ticks = sorted(set(values))
    ax.set_xticks(ticks, [_compact(v) for v in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelrotation=30, labelsize="small")


def _accuracy_span(ax) -> None:
    """Widen a fraction's y range to MIN_ACCURACY_SPAN around its middle, inside [0, 1]."""
    low, high = ax.get_ylim()
    if high - low >= MIN_ACCURACY_SPAN:
        return
    low = min(max((low + high - MIN_ACCURACY_SPAN) / 2, 0.0), 1.0 - MIN_ACCURACY_SPAN)
    ax.set_ylim(low, low + MIN_ACCURACY_SPAN)


def _pareto_front(points: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Points no other point beats on both x and y (each metric's better direction: trm/study/metrics.py)."""
    import pandas as pd

    sign_x, sign_y = (1 if PLOT_METRICS[axis].higher_is_better else -1 for axis in (x, y))
    ordered = points.assign(_x=sign_x * points[x], _y=sign_y * points[y]).sort_values(
        ["_x", "_y"], ascending=False
    )
    front, best = [], float("-inf")
    for _, row in ordered.iterrows():
        if row["_y"] > best:
            front.append(row.drop(["_x", "_y"]))
            best = row["_y"]
    return pd.DataFrame(front).sort_values(x)


def _references(ax, refs: pd.DataFrame, y: str) -> None:
    """Each reference run (groups.yaml `references`) as a dashed grey horizontal line at its mean of `y` over
    seeds, labelled with its label and n (a curve panel draws the references' curves: `_lines`)."""
    for _, ref in refs.drop_duplicates("id").iterrows():
        if y in ref and ref[y] == ref[y]:  # not NaN: measured
            n = f", n={int(ref[f'{y}_n'])}" if f"{y}_n" in ref else ""
            text = f"{ref['varied']} ({ref['id']}){n}"
            ax.axhline(ref.get(f"{y}_mean", ref[y]), linestyle="--", color="tab:gray", label=text)


def _panel(
    ax,
    plot: dict,
    group: dict,
    runs: pd.DataFrame,
    curves: pd.DataFrame,
    refs: pd.DataFrame,
    table: pd.DataFrame,
) -> None:
    """One `plots:` entry of the group. `curves`: every group's (a curve point's noise floor pools every baseline);
    `table`: every run of the table, for the runs' seeds and configurations."""
    x, y = plot["x"], plot["y"]
    ax.grid(alpha=0.3)
    if plot["kind"] == "curve":
        y = _metric(curves[curves["group"].isin([group["id"], REFERENCE_GROUP])], y, ax)
        ax.set_ylabel(label(y))
        ax.set_xlabel(label("epoch"))
        _lines(ax, group, curves, table, refs, "epoch", CURVE_METRICS[y], star_baseline=False)
        return
    y = _metric(runs, y, ax)
    ax.set_ylabel(label(y))
    ax.set_xlabel(label(x))
    members = [m for m in group["members"] if m in set(runs["id"])]
    runs = runs[runs["id"].isin(members)].copy()
    # One point per experiment at its mean, every run beside it; a value the table does not summarise (a config
    # key, a metric it computes from the config: the same for every run of an experiment) at its first run's.
    points = runs.drop_duplicates("id").set_index("id").reindex(members).reset_index()
    for name in (x, y):
        if f"{name}_mean" in points:
            points[name] = points[f"{name}_mean"]
    if f"{y}_n" not in points:
        points[f"{y}_n"] = points["id"].map(runs.dropna(subset=[y]).groupby("id").size()).fillna(0)
    if x == "member":
        points["member"] = range(len(points))
        runs["member"] = runs["id"].map(dict(zip(points["id"], points["member"], strict=True)))
        ax.set_xticks(
            points["member"], [f"{i}\n{v}" for i, v in zip(points["id"], points["varied"], strict=True)]
        )
        ax.tick_params(axis="x", labelsize="x-small")
    measured = points.dropna(subset=[x, y])
    if measured.empty:
        ax.text(
            0.5, 0.5, f"{y} was not measured by these runs", ha="center", va="center", transform=ax.transAxes
        )
        return
    if plot["log_x"]:
        ax.set_xscale("log")
        _log_ticks(ax, measured[x])
    if plot["kind"] == "pareto":
        ax.scatter(measured[x], measured[y], color="tab:blue", zorder=2)
        front = _pareto_front(measured, x, y)
        ax.plot(front[x], front[y], color="tab:blue", alpha=0.5, label="Pareto front")
    else:
        ax.plot(measured[x], measured[y], marker="o", color="tab:blue", zorder=2)
    _intervals(ax, measured, x, y)
    seeds = runs.dropna(subset=[x, y])
    ax.scatter(seeds[x], seeds[y], s=9, color="black", alpha=0.6, zorder=4, label="each run")
    for _, row in measured.iterrows():
        ax.annotate(
            f"{row['id']} (n={int(row[f'{y}_n'])})",
            (row[x], row[y]),
            fontsize="x-small",
            textcoords="offset points",
            xytext=(3, 3),
        )
    base = measured[measured["baseline"].astype(bool)]
    if not base.empty:
        ax.scatter(base[x], base[y], marker="*", s=250, color="tab:red", zorder=3, label="baseline")
    _references(ax, refs, y)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def _intervals(ax, points: pd.DataFrame, x: str, y: str) -> None:
    """Each experiment's 95% interval of y (the table's {y}_low and {y}_high) as an error bar: solid where it is
    measured over seeds, dashed where one run borrowed it (noise floor, test sampling: `{y}_interval`)."""
    if f"{y}_low" not in points:
        return
    known = points.dropna(subset=[f"{y}_low", f"{y}_high"])
    over_seeds = known[f"{y}_interval"] == SEEDS
    for part, style, text in (
        (known[over_seeds], "-", "95% interval over seeds"),
        (known[~over_seeds], "--", "95% interval of one run (noise floor or test sampling)"),
    ):
        if part.empty:
            continue
        errors = [part[y] - part[f"{y}_low"], part[f"{y}_high"] - part[y]]
        bars = ax.errorbar(
            part[x], part[y], yerr=errors, fmt="none", ecolor="tab:blue", capsize=3, zorder=1, label=text
        )
        bars[2][0].set_linestyle(style)


def _test_time_panel(
    ax, group: dict, test_time: pd.DataFrame, refs: pd.DataFrame, table: pd.DataFrame
) -> None:
    """Test exact accuracy after each evaluated number of supervision steps, one line per member with its band.
    `test_time`: every group's rows (the noise floor pools every baseline); `table`: every run, as for `_panel`."""
    ax.set_title("accuracy vs test-time supervision steps", fontsize="medium")
    shown = test_time["group"].isin([group["id"], REFERENCE_GROUP])
    y = _metric(test_time[shown], "exact_accuracy", ax)
    ax.set_xlabel(f"{TEST_TIME_METRICS['steps'].axis_label}, log scale")
    ax.set_ylabel(TEST_TIME_METRICS[y].axis_label)
    ax.grid(alpha=0.3)
    ax.set_xscale("log", base=2)
    steps = sorted(test_time.loc[shown, "steps"].unique())
    ax.set_xticks(steps, [str(k) for k in steps])
    ax.minorticks_off()
    _lines(ax, group, test_time, table, refs, "steps", TEST_TIME_METRICS[y], star_baseline=True)
    _accuracy_span(ax)


# A curve's band: its 95% interval, faint, so that 5-8 members' bands stay readable where they overlap.
BAND_ALPHA = 0.15
# A fraction's axis ends this far past 0 and 1, however far an interval reaches.
FRACTION_MARGIN = 0.02
SEED_STYLE = {"linewidth": 0.6, "alpha": 0.45, "marker": ".", "markersize": 3}


def _lines(
    ax,
    group: dict,
    points: pd.DataFrame,
    table: pd.DataFrame,
    refs: pd.DataFrame,
    x: str,
    metric: Metric,
    star_baseline: bool,
) -> None:
    """Per reference run (dashed grey), then per member: the mean line over x with its 95% band (bands.py), each
    run as a thin line, n in the legend; the baseline's thick and black."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    y = metric.key
    ref_ids = list(dict.fromkeys(refs["id"]))
    estimates = point_estimates(points, table, x, metric, [*group["members"], *ref_ids])
    for member in [*ref_ids, *group["members"]]:
        band = estimates[estimates["id"] == member]
        if band.empty:
            continue
        is_base, is_ref = member == group["baseline"], member in ref_ids
        style = {"linewidth": 2.5 if is_base else 1.2, "marker": "o", "markersize": None}
        if is_base:
            style.update(color="black", marker="*" if star_baseline else "o")
            style["markersize"] = 12 if star_baseline else None
        elif is_ref:
            style.update(color="tab:gray", linestyle="--", marker="")
        elif star_baseline:
            style["markersize"] = 5
        runs = points[points["id"] == member].dropna(subset=[y])
        (mean,) = ax.plot(
            band[x], band["mean"], label=_legend_text(member, band, runs, is_base, refs), **style
        )
        color = mean.get_color()
        # A reference's band hatched, so that it does not read as the baseline's grey.
        fill = {"facecolor": "none", "edgecolor": color, "hatch": "///"} if is_ref else {"color": color}
        shade = ax.fill_between(band[x], band["low"], band["high"], alpha=BAND_ALPHA, linewidth=0, **fill)
        shade.set_gid(f"band:{member}")
        for run, seed in runs.groupby("run"):
            (line,) = ax.plot(*_sorted(seed, x, y), color=color, **SEED_STYLE)
            line.set_gid(f"run:{run}")
    handles, labels = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], color="tab:gray", **SEED_STYLE),
        Patch(facecolor="tab:gray", alpha=2 * BAND_ALPHA),
    ]
    labels += ["each run", "95% interval (where n=1: of the source named)"]
    # Below the panel, in two columns: inside, 5-8 members' entries cover the curves.
    ax.legend(handles, labels, fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    if metric.unit.startswith("fraction"):  # an interval over seeds may reach past 0 or 1: not drawn there
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, -FRACTION_MARGIN), min(high, 1 + FRACTION_MARGIN))


def _sorted(rows: pd.DataFrame, x: str, y: str) -> tuple[pd.Series, pd.Series]:
    rows = rows.sort_values(x)
    return rows[x], rows[y]


def _legend_text(
    member: str, band: pd.DataFrame, runs: pd.DataFrame, is_base: bool, refs: pd.DataFrame
) -> str:
    """`exp01a (n=3)`; a single run says where its interval came from, `exp01b (n=1: noise floor + sampling)`;
    a reference run leads with its label, the baseline says it is one."""
    n = runs["run"].nunique()
    sources = " / ".join(dict.fromkeys(band.loc[band["n"] < 2, "source"]))
    text = f"n={n}: {sources}" if n < 2 and sources else f"n={n}"
    ref = refs[refs["id"] == member]
    if not ref.empty:
        return f"{ref['varied'].iloc[0]} ({member}), {text}"
    return f"{member} (baseline, {text})" if is_base else f"{member} ({text})"


def plot_group(
    group_id: str,
    runs: pd.DataFrame,
    curves: pd.DataFrame,
    test_time: pd.DataFrame,
    groups_path: Path,
    output: Path,
    sampled: pd.DataFrame | None = None,
) -> None:
    """Write OUTPUT.png and OUTPUT.svg for one group: its plots of groups.yaml, then accuracy vs test-time steps,
    then, where its runs sampled, accuracy vs test-time FLOPs (trm/analysis/compute_plot.py)."""
    groups = {g["id"]: g for g in load_groups(groups_path, groups_path.parent / "experiments")}
    if group_id not in groups:
        raise UserError(f"unknown group {group_id!r}: one of {', '.join(groups)}")
    # Every run of the table measures the noise floors; the runs only there for it (`floor_only`) are not drawn.
    table, shown = runs, selected_runs(runs)
    refs, runs = shown[shown["group"] == REFERENCE_GROUP], shown[shown["group"] == group_id]
    group = {**groups[group_id], "members": [m for m in groups[group_id]["members"] if m in set(runs["id"])]}
    if runs.empty:
        raise UserError(f"the table has no run of group {group_id}")
    if not (test_time["group"] == group_id).any():
        raise UserError(f"the test-time table has no run of group {group_id}")
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers and TPU hosts
    import matplotlib.pyplot as plt

    plots = group["plots"]
    compute = sampled is not None and sampled["id"].isin(group["members"]).any()
    panels = len(plots) + 1 + compute
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 6), squeeze=False)
    for ax, plot in zip(axes[0], plots, strict=False):
        _panel(ax, plot, group, runs, curves, refs, table)
    _test_time_panel(axes[0][len(plots)], group, test_time, refs, table)
    if compute:
        compute_panel(axes[0][-1], group, test_time, sampled)
    fig.suptitle(f"{group_id}: {group['title']}")
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        image = io.BytesIO()
        fig.savefig(image, format=suffix[1:], dpi=120)
        storage.write_bytes(str(output.with_suffix(suffix)), image.getvalue())
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("group", help="group id, e.g. exp01")
    parser.add_argument(
        "--table",
        required=True,
        help="aggregate table path without suffix (reads .csv, -curves.csv, -test-time.csv, -sampled.csv)",
    )
    parser.add_argument("--groups", required=True, type=Path, help="config/groups.yaml")
    parser.add_argument("--output", required=True, type=Path, help="output path without suffix (.png, .svg)")


def main(args: argparse.Namespace) -> int:
    runs = read_table(f"{args.table}.csv", RUN_TABLE_COLUMNS)
    curves = read_table(f"{args.table}-curves.csv", CURVE_COLUMNS)
    test_time = read_table(f"{args.table}-test-time.csv", TEST_TIME_COLUMNS)
    sampled = read_table(f"{args.table}-sampled.csv", SAMPLED_COLUMNS)
    plot_group(args.group, runs, curves, test_time, args.groups, args.output, sampled)
    return 0
