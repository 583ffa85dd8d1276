"""Group plots: where a group's exact accuracy is 0 for every run (short smoke runs), the panels draw cell accuracy
and say so; where any run is exactly right somewhere, they draw exact accuracy. Each experiment is drawn at its
mean with its 95% interval and n, every run as a dot."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from workflow_support import runs_table

from trm.analysis.compute_plot import compute_panel
from trm.analysis.plots import FALLBACK_TITLE, _pareto_front, plot_group
from trm.study.groups import GROUPS_PATH, load_groups
from trm.study.metrics import CURVE_METRICS, RUN_METRICS


def tables(group: dict, exact: float) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Runs, curves and test-time rows for every member (one run each, evaluations of 16 puzzles): cell accuracy
    0.3 + 0.1 i, exact accuracy `exact`."""
    members = group["members"]
    runs = runs_table(
        pd.DataFrame(
            {
                "id": members,
                "varied": [f"m{i}" for i in range(len(members))],
                "baseline": [m == group["baseline"] for m in members],
                "test_exact_accuracy": exact,
                "test_cell_accuracy": [0.3 + 0.1 * i for i in range(len(members))],
            }
        ),
        group["id"],
    )
    curves = pd.DataFrame(
        [
            {
                "id": m,
                "run": m,
                "group": group["id"],
                "epoch": epoch,
                "count": 16,
                "test_exact_accuracy": exact,
                "test_cell_accuracy": 0.2,
            }
            for m in members
            for epoch in (36, 72)
        ]
    )
    test_time = pd.DataFrame(
        [
            {
                "id": m,
                "run": m,
                "group": group["id"],
                "baseline": False,
                "steps": k,
                "count": 16,
                "exact_accuracy": exact,
                "accuracy": 0.4,
            }
            for m in members
            for k in (16, 32)
        ]
    )
    return runs, curves, test_time


@pytest.mark.slow
def test_a_group_never_exactly_right_is_plotted_in_cell_accuracy_and_says_so(tmp_path: Path):
    group = next(g for g in load_groups() if g["id"] == "exp09")  # a curve panel and the test-time panel
    for exact, fallback in ((0.0, True), (0.25, False)):
        output = tmp_path / f"exact-{exact}"
        plot_group("exp09", *tables(group, exact), Path(GROUPS_PATH), output)
        svg = output.with_suffix(".svg").read_text()
        assert (FALLBACK_TITLE in svg) == fallback
        assert ("test cell accuracy" in svg) == fallback and ("test exact accuracy" in svg) != fallback


def test_axes_stay_legible_log_ticks_apart_and_a_small_accuracy_change_flat():
    """exp01's parameter axis spans about a decade and a half: matplotlib's own minor-tick labels ('3x10^6',
    '4x10^6') overlapped there. A test-time panel whose values span 0.7384-0.7392 spans at least
    MIN_ACCURACY_SPAN, so the 0.1-point change does not fill the panel."""
    import itertools

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trm.analysis.plots import MIN_ACCURACY_SPAN, _panel, _test_time_panel

    group = next(g for g in load_groups() if g["id"] == "exp01")
    members = group["members"]
    runs = runs_table(
        pd.DataFrame(
            {
                "id": members,
                "baseline": [m == group["baseline"] for m in members],
                "parameter_count": [
                    1.48e6,
                    2.97e6,
                    5.03e6,
                    9.75e6,
                    21.6e6,
                    38.1e6,
                ],  # the paper-scale widths'
                "test_exact_accuracy": [0.70, 0.80, 0.87, 0.86, 0.85, 0.84],
            }
        ),
        "exp01",
    )
    test_time = pd.DataFrame(
        [
            {
                "id": m,
                "run": m,
                "group": "exp01",
                "baseline": False,
                "steps": k,
                "count": 1000,
                "exact_accuracy": accuracy,
                "accuracy": 0.9,
            }
            for m in members
            for k, accuracy in ((16, 0.7384), (32, 0.7392))
        ]
    )
    fig, (ax, ax_test_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    _panel(ax, group["plots"][0], group, runs, runs.iloc[:0], runs.iloc[:0], runs)
    _test_time_panel(ax_test_time, group, test_time, runs.iloc[:0], runs)
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    low, high = ax.get_xlim()
    labels = [
        t
        for t in ax.get_xticklabels(which="both")
        if t.get_visible() and t.get_text() and low <= t.get_position()[0] <= high
    ]
    assert [t.get_text() for t in labels] == ["1.48M", "2.97M", "5.03M", "9.75M", "21.6M", "38.1M"]
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not [
        (labels[i].get_text(), labels[j].get_text())
        for i, j in itertools.combinations(range(len(boxes)), 2)
        if boxes[i].overlaps(boxes[j])
    ]
    low, high = ax_test_time.get_ylim()
    assert high - low >= MIN_ACCURACY_SPAN - 1e-12 and low <= 0.7384 and high >= 0.7392
    plt.close(fig)


def test_exp08_plots_only_what_its_runs_measure(tmp_path: Path):
    group = next(g for g in load_groups() if g["id"] == "exp08")
    output = tmp_path / "exp08"
    plot_group("exp08", *tables(group, 0.25), Path(GROUPS_PATH), output)
    svg = output.with_suffix(".svg").read_text()
    assert "was not measured" not in svg
    # Axis labels come from the metric registry.
    assert RUN_METRICS["test_exact_accuracy"].axis_label in svg and CURVE_METRICS["epoch"].axis_label in svg


def test_a_pareto_front_follows_each_metrics_better_direction():
    points = pd.DataFrame(
        {
            "id": ["fast-bad", "slow-good", "slow-bad", "mid"],
            "step_time_s": [1.0, 3.0, 3.0, 2.0],
            "test_exact_accuracy": [0.5, 0.9, 0.6, 0.5],
        }
    )
    # Lower step time and higher accuracy are better: "mid" is beaten by "fast-bad", "slow-bad" by "slow-good".
    front = _pareto_front(points, "step_time_s", "test_exact_accuracy")
    assert list(front["id"]) == ["fast-bad", "slow-good"]
    assert list(front.columns) == list(points.columns)


def test_each_experiment_is_drawn_at_its_mean_with_its_interval_every_run_as_a_dot_and_its_n():
    """The baseline has 3 seeds: a solid interval over them; the other members one run each, with the interval
    the table borrowed (noise floor + test sampling) dashed. Every label gives n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trm.analysis.judge import add_estimates, floor_ids, noise_floors
    from trm.analysis.plots import _panel
    from trm.analysis.uncertainty import FLOOR_AND_SAMPLING, SEEDS

    group = next(g for g in load_groups() if g["id"] == "exp01")
    members = group["members"]
    seeds = {
        m: [0.40, 0.46, 0.43] if m == group["baseline"] else [0.30 + 0.02 * i] for i, m in enumerate(members)
    }
    width = {m: 1e6 * 2**i for i, m in enumerate(members)}
    runs = runs_table(
        pd.DataFrame(
            [
                {
                    "id": m,
                    "baseline": m == group["baseline"],
                    "seed": seed,
                    "parameter_count": width[m],
                    "test_exact_accuracy": value,
                }
                for m in members
                for seed, value in enumerate(seeds[m])
            ]
        ),
        "exp01",
    )
    metrics = ["test_exact_accuracy"]
    runs = add_estimates(runs, metrics, noise_floors(runs, metrics, floor_ids(runs)), test_puzzles=1000)
    sources = runs.drop_duplicates("id").set_index("id")["test_exact_accuracy_interval"]
    assert sources[group["baseline"]] == SEEDS and sources["exp01a"] == FLOOR_AND_SAMPLING
    fig, ax = plt.subplots()
    _panel(ax, group["plots"][0], group, runs, runs.iloc[:0], runs.iloc[:0], runs)
    labels = {t.get_text() for t in ax.texts}
    assert f"{group['baseline']} (n=3)" in labels and "exp01a (n=1)" in labels
    (line,) = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert list(line.get_ydata())[members.index(group["baseline"])] == pytest.approx(0.43)  # the mean
    dots = next(c for c in ax.collections if c.get_label() == "each run")
    assert len(dots.get_offsets()) == len(runs) == len(members) + 2
    styles = {c.get_label(): c.lines[2][0].get_linestyle()[0] for c in ax.containers}
    over_seeds, one_run = (
        styles["95% interval over seeds"],
        styles["95% interval of one run (noise floor or test sampling)"],
    )
    assert over_seeds[1] is None and one_run[1] is not None  # solid: no dash pattern; dashed: one
    plt.close(fig)


# Curve and test-time bands: exp09's baseline with 3 seeds, one member with 1 run that also reaches a last x the
# baseline does not (no noise floor there). Values per x; the last x of the baseline scored the whole split.
BAND_XS = {"epoch": (10.0, 20.0, 30.0, 40.0), "steps": (1, 4, 16, 64)}
BAND_RUNS = {
    ("exp09a", 0): (0.20, 0.41, 0.55),
    ("exp09a", 1): (0.26, 0.45, 0.61),
    ("exp09a", 2): (0.23, 0.40, 0.58),
    ("exp09b", 0): (0.18, 0.35, 0.50, 0.52),
}
PUZZLES = (500, 500, 2000, 500)  # per x: a subset, the whole split at the third


def band_tables(x: str, y: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs table, curve or test-time rows) of BAND_RUNS, as `trm aggregate` writes them."""
    runs, points = [], []
    for (exp, seed), values in BAND_RUNS.items():
        run = exp if seed == 0 else f"{exp}~s{seed}"
        base = {"id": exp, "group": "exp09", "baseline": exp == "exp09a", "run": run}
        runs.append(
            {**base, "varied": exp, "config_key": exp, "seed": seed, "test_exact_accuracy": values[-1]}
        )
        points += [
            {**base, x: at, "count": puzzles, y: value, "accuracy": 0.9, "test_cell_accuracy": 0.9}
            for at, puzzles, value in zip(BAND_XS[x], PUZZLES, values, strict=False)
        ]
    return runs_table(pd.DataFrame(runs)), pd.DataFrame(points)


def band_edges(collection) -> dict[float, tuple[float, float]]:
    """x -> (low, high) of a fill_between band, from its outline's vertices."""
    edges: dict[float, list[float]] = {}
    for vx, vy in collection.get_paths()[0].vertices:
        edges.setdefault(float(vx), []).append(float(vy))
    return {vx: (min(vy), max(vy)) for vx, vy in edges.items()}


@pytest.mark.parametrize(("x", "y"), [("epoch", "test_exact_accuracy"), ("steps", "exact_accuracy")])
def test_curve_bands_are_the_uncertainty_modules_intervals_and_every_run_is_drawn(x: str, y: str):
    """The 3-seed baseline's band at each x is the interval over its seeds; the 1-run member's is the noise floor
    measured on the baseline's seeds at that x with the sampling interval of the puzzles evaluated there, and
    sampling only where the baseline has no seeds. Every run is a thin line of its own values; n is in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trm.analysis.plots import _panel, _test_time_panel
    from trm.analysis.uncertainty import FLOOR_AND_SAMPLING, SAMPLING_ONLY, estimate, noise_floor

    group = next(g for g in load_groups() if g["id"] == "exp09")
    runs, points = band_tables(x, y)
    fig, ax = plt.subplots()
    if x == "epoch":
        _panel(ax, group["plots"][0], group, runs, points, runs.iloc[:0], table=runs)
    else:
        _test_time_panel(ax, group, points, runs.iloc[:0], table=runs)
    bands = {c.get_gid(): band_edges(c) for c in ax.collections if c.get_gid()}
    seeds = {i: [v[i] for (exp, _), v in BAND_RUNS.items() if exp == "exp09a"] for i in range(3)}
    for i, at in enumerate(BAND_XS[x][:3]):
        over_seeds = estimate(seeds[i])
        assert bands["band:exp09a"][at] == pytest.approx((over_seeds.low, over_seeds.high))
        one_run = estimate([BAND_RUNS["exp09b", 0][i]], noise_floor({"exp09a": seeds[i]}), PUZZLES[i])
        assert one_run.source == FLOOR_AND_SAMPLING
        assert bands["band:exp09b"][at] == pytest.approx((one_run.low, one_run.high))
    last = estimate([BAND_RUNS["exp09b", 0][3]], None, PUZZLES[3])
    assert last.source == SAMPLING_ONLY and last.high - last.low > 0
    assert bands["band:exp09b"][BAND_XS[x][3]] == pytest.approx((last.low, last.high))
    assert set(bands) == {"band:exp09a", "band:exp09b"}
    drawn = {line.get_gid(): list(line.get_ydata()) for line in ax.get_lines() if line.get_gid()}
    assert drawn == {
        f"run:{run}": list(values) for run, values in zip(runs["run"], BAND_RUNS.values(), strict=True)
    }
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "exp09a (baseline, n=3)" in legend
    assert f"exp09b (n=1: {FLOOR_AND_SAMPLING} / {SAMPLING_ONLY})" in legend
    (mean,) = [line for line in ax.get_lines() if line.get_label() == "exp09a (baseline, n=3)"]
    assert list(mean.get_ydata()) == pytest.approx([sum(seeds[i]) / 3 for i in range(3)])
    plt.close(fig)


def test_the_test_time_compute_panel_joins_each_members_best_accuracy_at_or_below_each_flop_count(
    tmp_path: Path,
):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    group = {"id": "g", "members": ["a", "b"], "baseline": "a"}
    row = {"group": "g", "baseline": False, "count": 16}
    # Member a: one trajectory at 16 and 32 steps (1 and 2 units of FLOPs), 4 trajectories at 16 steps (4 units);
    # two seeds of it, averaged. Member b: worse at 16 steps, better than a at 32.
    test_time = pd.DataFrame(
        [
            {
                **row,
                "id": m,
                "run": f"{m}{s}",
                "steps": steps,
                "flops_per_puzzle": steps // 16,
                "exact_accuracy": y,
            }
            for m, s, steps, y in (
                ("a", 0, 16, 0.4),
                ("a", 1, 16, 0.6),
                ("a", 0, 32, 0.3),
                ("a", 1, 32, 0.5),
                ("b", 0, 16, 0.1),
                ("b", 0, 32, 0.7),
            )
        ]
    ).assign(accuracy=0.5)
    sampled = pd.DataFrame(
        [{**row, "id": "a", "run": "a0", "steps": 16, "trajectories": 4, "flops_per_puzzle": 4}]
    ).assign(q_exact_accuracy=0.9, q_accuracy=0.95)
    fig, ax = plt.subplots()
    compute_panel(ax, group, test_time, sampled)
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert curves["a (baseline)"] == ([1, 2, 4], [0.5, 0.5, 0.9])  # a's 32 steps (0.4) below its 16 (0.5)
    assert curves["b"] == ([1, 2], [0.1, 0.7])
    assert "accuracy vs test-time FLOPs per puzzle" == ax.get_title()
    plt.close(fig)
    # A group whose runs sampled gets the panel as its last; one whose runs did not, none.
    exp09 = next(g for g in load_groups() if g["id"] == "exp09")
    runs, curves_table, plain = tables(exp09, 0.25)
    plain = plain.assign(flops_per_puzzle=plain["steps"] * 1e6)
    noisy = plain.assign(trajectories=4, q_exact_accuracy=0.5, q_accuracy=0.6)
    for rows, drawn in ((noisy, True), (noisy.iloc[:0], False)):
        output = tmp_path / f"exp09-{drawn}"
        plot_group("exp09", runs, curves_table, plain, Path(GROUPS_PATH), output, rows)
        assert ("accuracy vs test-time FLOPs per puzzle" in output.with_suffix(".svg").read_text()) == drawn


@pytest.mark.slow
def test_a_reference_is_drawn_in_every_panel_and_a_run_only_for_the_noise_floor_in_none(tmp_path: Path):
    """The table of a selection without its group's baseline: the baseline's seeds are there only to measure the
    noise floor (`floor_only`), and the reference (groups.yaml `references`, group "reference") is there for every
    group. Each panel draws the reference with its label; none draws the floor's runs."""
    for group_id in ("exp01", "exp09"):  # a panel over the members' parameter counts; one over epochs
        group = next(g for g in load_groups() if g["id"] == group_id)
        baseline = group["baseline"]
        runs, curves, test_time = tables({**group, "members": [m for m in group["members"] if m != baseline][:2]}, 0.25)  # fmt: skip
        label = {"varied": "paper recipe (batch 768)", "test_exact_accuracy": 0.5, "test_cell_accuracy": 0.6}
        ref = runs_table(pd.DataFrame([{"id": "ref_paper", **label}]), "reference")
        floor = runs_table(pd.DataFrame({"id": [baseline] * 2, "test_cell_accuracy": [0.5, 0.52]}), group_id)
        runs = pd.concat([runs, ref, floor.assign(baseline=True, floor_only=True)], ignore_index=True)
        runs["parameter_count"] = 1e6 * (1 + runs.index)  # what exp01 plots against
        others = [("ref_paper", "ref_paper", "reference", False), *((baseline, r, group_id, True) for r in floor["run"])]  # fmt: skip
        row = {"count": 16, "test_exact_accuracy": 0.3, "test_cell_accuracy": 0.4, "exact_accuracy": 0.3, "accuracy": 0.4}  # fmt: skip
        extra = [{"id": i, "run": r, "group": g, "baseline": b, **row} for i, r, g, b in others]
        curves = pd.concat([curves, pd.DataFrame([{**x, "epoch": e} for x in extra for e in (36, 72)])])
        test_time = pd.concat([test_time, pd.DataFrame([{**x, "steps": k} for x in extra for k in (16, 32)])])
        output = tmp_path / group_id
        plot_group(group_id, runs, curves.reset_index(drop=True), test_time.reset_index(drop=True), Path(GROUPS_PATH), output)  # fmt: skip
        svg = output.with_suffix(".svg").read_text()
        panels = len(group["plots"]) + 1  # the test-time panel
        assert svg.count("paper recipe (batch 768) (ref_paper)") == panels, group_id
        assert f"run:{baseline}" not in svg and f"band:{baseline}" not in svg, group_id
