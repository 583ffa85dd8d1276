"""The study's metrics, each defined once: its key (a column of the results table), what it means, its axis label
and unit, and which way is better. The summary of a run (`trm summarize`), the table (`trm aggregate`), the plots,
the success criteria (config/groups.yaml, `trm verdicts`) and the generated guides (docs/experiments/) all read it.

Four tables, four vocabularies:
  RUN_METRICS        one row per run (table.csv): what plots and criteria name. `source` says who computes it:
                     "run" from the run dir (`trm summarize`), "table" from the config and the training job's
                     benchmark (`trm aggregate`).
  CURVE_METRICS      one row per evaluation during training (table-curves.csv)
  TEST_TIME_METRICS  one row per run and test-time step count (table-test-time.csv): the fields of the trainer's
                     final evaluation (trm/train/evaluator.py says how each is measured)
  SAMPLED_METRICS    one row per run, test-time step count and trajectories per puzzle (table-sampled.csv): the
                     final evaluation's sampled recursion (trm/train/sampled.py)

There is no accuracy of the raw (non-EMA) weights of an EMA run: the trainer evaluates the weights it checkpoints
(the EMA weights when EMA is on, as the original does), and scoring the raw ones too would cost a second pass over
the whole test split per run. The paper's EMA figure (79.9% vs 87.4%) compares a run trained without EMA with one
trained with it, which is what exp08 compares (exp08a against exp08d, both `test_exact_accuracy`).
"""

from __future__ import annotations

from dataclasses import dataclass

FRACTION_OF_PUZZLES = "fraction of puzzles"
FRACTION_OF_CELLS = "fraction of cells"
TARGET_ACCURACY = 0.85  # contrib01's "epochs to 85%"


@dataclass(frozen=True)
class Metric:
    key: str
    meaning: str
    label: str
    unit: str
    higher_is_better: bool | None  # None: neither way is better (a description of the run, such as its size)
    source: str = "run"  # RUN_METRICS only: "run" (trm summarize) or "table" (trm aggregate)
    # An exact accuracy's cell accuracy, which the plots draw and the smoke-scale verdicts judge instead when the
    # exact accuracy is 0 for every run of a group (tiny models solve no whole puzzle).
    cell_fallback: str | None = None
    # RUN_METRICS only: a fraction of the whole test split's puzzles, so one run's value has a sampling interval
    # (docs/statistics.md); `puzzle_sd` names the column with that run's sd of it over the puzzles, when recorded.
    sampled_over_test_split: bool = False
    puzzle_sd: str | None = None

    @property
    def axis_label(self) -> str:
        return f"{self.label} ({self.unit})"


def _by_key(*metrics: Metric) -> dict[str, Metric]:
    return {metric.key: metric for metric in metrics}


# In the order of the table's columns.
RUN_METRICS = _by_key(
    Metric("parameter_count", "parameters of the model", "parameters", "count", None, "table"),
    Metric(
        "train_flops_per_example_step",
        "FLOPs of one training supervision step of one example (forward and backward)",
        "training FLOPs per example and step",
        "FLOP",
        None,
        "table",
    ),
    Metric(
        "run_flops",
        "FLOPs of the training job: its training steps and every evaluation (the last one to the test-time counts)",
        "run FLOPs",
        "FLOP",
        None,
        "table",
    ),
    Metric(
        "effective_depth",
        "layer applications per supervision step, H_cycles x (L_cycles + 1) x L_layers",
        "effective depth",
        "layer applications per step",
        None,
        "table",
    ),
    Metric(
        "test_exact_accuracy",
        "fraction of test puzzles solved exactly at the end (EMA weights when EMA is on)",
        "test exact accuracy",
        FRACTION_OF_PUZZLES,
        True,
        cell_fallback="test_cell_accuracy",
        sampled_over_test_split=True,
    ),
    Metric(
        "best_test_exact_accuracy",
        "highest test exact accuracy of the run's evaluations (the intermediate ones on train.eval_subset "
        "puzzles, the last on the full test split)",
        "best test exact accuracy",
        FRACTION_OF_PUZZLES,
        True,
    ),
    Metric("best_test_epoch", "epoch of the best evaluation", "epoch of the best evaluation", "epochs", None),
    Metric(
        "best_test_puzzles",
        "test puzzles the best evaluation scored",
        "puzzles of the best evaluation",
        "count",
        None,
    ),
    Metric(
        "test_cell_accuracy",
        "fraction of test cells right at the end",
        "test cell accuracy",
        FRACTION_OF_CELLS,
        True,
        sampled_over_test_split=True,
        puzzle_sd="test_cell_accuracy_puzzle_sd",
    ),
    Metric(
        "test_cell_accuracy_puzzle_sd",
        "standard deviation over the test puzzles of each puzzle's fraction of right cells at the end (the "
        "sampling interval of a one-run test cell accuracy is read from it)",
        "per-puzzle sd of test cell accuracy",
        FRACTION_OF_CELLS,
        None,
    ),
    Metric(
        "train_exact_accuracy",
        "fraction of training puzzles solved exactly (last eval interval)",
        "train exact accuracy",
        FRACTION_OF_PUZZLES,
        True,
    ),
    Metric(
        "train_test_gap",
        "train exact accuracy minus test exact accuracy",
        "train − test exact accuracy",
        "fraction",
        False,
    ),
    Metric(
        "mean_halt_steps",
        "mean supervision steps a training example used before halting (last eval interval)",
        "mean halt steps",
        "supervision steps",
        None,
    ),
    Metric(
        "halt_steps_variance",
        "variance of the supervision steps before halting (last eval interval, pooled over its rows)",
        "halt-step variance",
        "steps²",
        None,
    ),
    Metric(
        "examples_per_second",
        "training throughput, examples/s (median over the run's train records after the first, which compiles)",
        "training throughput",
        "examples/s",
        True,
    ),
    Metric(
        "step_time_s",
        "training step time in seconds, global batch / examples per second",
        "training step time",
        "s",
        False,
    ),
    Metric(
        "epochs_to_85pct",
        f"epochs to the first evaluation at or above {TARGET_ACCURACY:.0%} test exact accuracy",
        f"epochs to {TARGET_ACCURACY:.0%} test exact accuracy",
        "epochs",
        False,
    ),
    Metric("steps", "optimizer steps the run trained", "training steps", "count", None),
    Metric("epochs", "epochs the run trained", "training epochs", "epochs", None),
    Metric(
        "wall_time_s",
        "wall time of the run over all its attempts, each from its `trm train` command's start to its last record "
        "(final.json, kept from status.json's elapsed_s): the run's own, whichever job collected it, and shared "
        "by the experiments that share the run",
        "wall time",
        "s",
        False,
    ),
    Metric(
        "accelerator_hours",
        "the run's measured wall hours (wall_time_s) x the devices it trained on",
        "accelerator-hours",
        "device-hours",
        False,
        "table",
    ),
    Metric(
        "estimated_accelerator_hours",
        "run_flops at the workflow's accelerator peak FLOP/s and assumed utilization",
        "estimated accelerator-hours",
        "device-hours",
        None,
        "table",
    ),
    *(
        Metric(
            f"sampled_{rule}_exact_accuracy",
            f"test exact accuracy of the answer {meaning}, from the largest count of trajectories of the final "
            "evaluation's sampled recursion (test_time_trajectories), after the first test_time_steps count, on "
            "the test-time subset (empty without sampling)",
            f"sampled exact accuracy ({label})",
            FRACTION_OF_PUZZLES,
            True,
        )
        for rule, meaning, label in (
            ("q", "of the trajectory with the highest Q-halt logit", "Q head picks"),
            ("vote", "most trajectories give", "majority vote"),
            ("oracle", "of any trajectory (the ceiling of a selection rule)", "any trajectory"),
        )
    ),
)
SUMMARY_METRICS = tuple(key for key, metric in RUN_METRICS.items() if metric.source == "run")

# The puzzles one evaluation scored (an evaluation record's "count"): the size of its accuracies' sampling interval,
# which differs between a training evaluation (train.eval_subset), the final one and the test-time curve's subset.
EVALUATED_PUZZLES = Metric(
    "count",
    "test puzzles the evaluation scored (its sampling interval's size)",
    "test puzzles",
    "puzzles",
    None,
)

CURVE_METRICS = _by_key(
    Metric(
        "epoch",
        "training epochs at the evaluation (x axis of curves over training)",
        "training epochs",
        "epochs",
        None,
    ),
    EVALUATED_PUZZLES,
    Metric(
        "test_exact_accuracy",
        "test exact accuracy of that evaluation (on train.eval_subset puzzles, the last on the full test split)",
        "test exact accuracy",
        FRACTION_OF_PUZZLES,
        True,
        cell_fallback="test_cell_accuracy",
    ),
    Metric(
        "test_cell_accuracy",
        "test cell accuracy of that evaluation",
        "test cell accuracy",
        FRACTION_OF_CELLS,
        True,
    ),
)

TEST_TIME_METRICS = _by_key(
    Metric("steps", "supervision steps run at test time", "test-time supervision steps", "count", None),
    EVALUATED_PUZZLES,
    Metric(
        "exact_accuracy",
        "test puzzles whose cells are all right",
        "test exact accuracy",
        FRACTION_OF_PUZZLES,
        True,
        cell_fallback="accuracy",
    ),
    Metric(
        "accuracy", "right cells / cells, averaged per puzzle", "test cell accuracy", FRACTION_OF_CELLS, True
    ),
    Metric(
        "q_halt_accuracy",
        "puzzles where the Q head's halt decision agrees with the answer being exactly right",
        "Q-halt accuracy",
        FRACTION_OF_PUZZLES,
        True,
    ),
    Metric(
        "mean_halt_step",
        "mean first step at which the Q head says halt (the count itself when it has not)",
        "mean halt step",
        "supervision steps",
        None,
    ),
    Metric("halted_fraction", "puzzles whose Q head said halt", "halted", FRACTION_OF_PUZZLES, None),
    Metric(
        "halt_exact_accuracy",
        "exact accuracy of the answer at the first halt step: what adaptive halting would score",
        "exact accuracy at the halt step",
        FRACTION_OF_PUZZLES,
        True,
    ),
)

# A column of the test-time and sampled tables that the table computes (trm aggregate), not the run: the test-time
# compute of one puzzle's answer at that row.
TEST_TIME_FLOPS = Metric(
    "flops_per_puzzle",
    "forward FLOPs spent on one puzzle at test time: steps x one supervision step's forward FLOPs (x trajectories)",
    "test-time FLOPs per puzzle",
    "FLOPs",
    None,
)

SAMPLED_METRICS = _by_key(
    TEST_TIME_METRICS["steps"],
    Metric("trajectories", "noisy trajectories per puzzle (K)", "trajectories per puzzle", "count", None),
    Metric("sigma", "sd of the noise added to z_L before each supervision step", "noise sd", "sd", None),
    EVALUATED_PUZZLES,
    *(
        Metric(f"{rule}_{kind}", f"{what} of the answer {meaning}", f"{label} ({short})", unit, True)
        for rule, meaning, label in (
            ("q", "of the trajectory with the highest Q-halt logit", "Q head picks"),
            ("vote", "most trajectories give", "majority vote"),
        )
        for kind, what, short, unit in (
            ("exact_accuracy", "test exact accuracy", "exact", FRACTION_OF_PUZZLES),
            ("accuracy", "test cell accuracy", "cells", FRACTION_OF_CELLS),
        )
    ),
    Metric(
        "oracle_exact_accuracy",
        "test puzzles some trajectory solves (the ceiling of a selection rule)",
        "any trajectory right",
        FRACTION_OF_PUZZLES,
        True,
    ),
    Metric(
        "trajectory_exact_accuracy",
        "test exact accuracy of one noisy trajectory, averaged over the trajectories",
        "one noisy trajectory",
        FRACTION_OF_PUZZLES,
        True,
    ),
)

# What a plot's axis or a criterion may name besides config keys (a plot's x may also be `member`).
PLOT_METRICS = {**RUN_METRICS, "epoch": CURVE_METRICS["epoch"]}
CRITERION_METRICS = RUN_METRICS

# Each exact accuracy of the three tables -> its cell accuracy (Metric.cell_fallback).
CELL_FALLBACK = {
    metric.key: metric.cell_fallback
    for table in (RUN_METRICS, CURVE_METRICS, TEST_TIME_METRICS)
    for metric in table.values()
    if metric.cell_fallback
}
