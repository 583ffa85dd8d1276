"""Print our run's and the original's training curves side by side (docs/performance.md, the GPU comparison).

Reads our run dir's metrics.jsonl (train records, each summed over the --log-every steps before it, and eval
records) and the JSON-lines log benchmarks/train_original.py writes (the original's wandb records: train
metrics of every step, and its evaluations as {"all": {...}}). The original's per-step train figures are
averaged over the same windows as ours: lm_loss and q_halt_loss exactly (both are per-example means of each
step's full batch); accuracy and exact_accuracy as the plain mean of each step's figure, since the original
divides them by the step's count of halted rows and does not log that count (ours weights each step by it).

    python benchmarks/compare_curves.py RUN_DIR/metrics.jsonl original.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

TRAIN_KEYS = ("lm_loss", "q_halt_loss", "accuracy", "exact_accuracy")
EVAL_KEYS = ("lm_loss", "accuracy", "exact_accuracy")


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"{path}: not found")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("ours", type=Path, help="our run dir's metrics.jsonl")
    parser.add_argument("original", type=Path, help="the log of benchmarks/train_original.py")
    args = parser.parse_args()
    ours, original = read_jsonl(args.ours), read_jsonl(args.original)
    original_train = {r["step"]: r for r in original if "train/lm_loss" in r}
    print("train (ours | original, mean over the same window of steps)")
    print(f"{'step':>6} " + " ".join(f"{k:>15}" for k in TRAIN_KEYS))
    previous = 0
    for record in (r for r in ours if r.get("kind") == "train"):
        step = record["step"]
        window = [original_train[s] for s in range(previous + 1, step + 1) if s in original_train]
        previous = step
        cells = []
        for key in TRAIN_KEYS:
            theirs = statistics.fmean(r[f"train/{key}"] for r in window) if window else float("nan")
            ours_value = (
                float("nan") if record[key] is None else record[key]
            )  # None: no row halted in the window
            cells.append(f"{ours_value:7.4f}|{theirs:7.4f}")
        print(f"{step:6d} " + " ".join(f"{c:>15}" for c in cells))
    print("\nevaluation on the test split (ours | original)")
    print(f"{'step':>6} " + " ".join(f"{k:>15}" for k in EVAL_KEYS))
    original_eval = {r["step"]: r["all"] for r in original if isinstance(r.get("all"), dict)}
    for record in (r for r in ours if r.get("kind") == "eval"):
        theirs = original_eval.get(record["step"], {})
        cells = [f"{record[k]:7.4f}|{theirs.get(k, float('nan')):7.4f}" for k in EVAL_KEYS]
        print(f"{record['step']:6d} " + " ".join(f"{c:>15}" for c in cells))
    seconds = [r["wall_s"] for r in original if "wall_s" in r]
    speeds = [r["examples_per_s"] for r in ours if r.get("kind") == "train"][
        1:
    ]  # the first holds the compile
    if seconds and speeds:
        print(
            f"\nours: median {statistics.median(speeds):.0f} examples/s over its train records after the "
            f"first; original: {seconds[-1]:.0f} s from its first log to its last"
        )


if __name__ == "__main__":
    main()
