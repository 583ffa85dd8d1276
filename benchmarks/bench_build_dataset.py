"""Benchmark: build 1000 Sudoku puzzles x 1000 augmentations, vectorised (`trm build-dataset`) vs a per-example loop.

The loop builder below is a plain transcription of the original builder's approach: one
augmentation drawn and applied per example, boards collected in Python lists, stacked into int64 arrays.
Each build runs in its own subprocess, which reports its wall time and peak resident memory
(getrusage RUSAGE_SELF ru_maxrss). Also measures the offline generator's puzzles per second.

Source: the shared magictour_top1465 CSV when present, else a CSV of generated puzzles (slow to make).

    .venv/bin/python benchmarks/bench_build_dataset.py [--puzzles 1000] [--num-aug 1000]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED_CSV = (
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sudoku" / "magictour_top1465.csv.gz"
)


def build_vectorised(source: Path, out: Path, puzzles: int, num_aug: int) -> None:
    from trm.cli import main as trm

    # One file, split by the seed into train (80%, subsampled) and test: a dataset holds each puzzle once.
    argv = ["build-dataset", "--source", str(source), "--output-dir", str(out)]
    if trm([*argv, "--subsample-size", str(puzzles), "--num-aug", str(num_aug)]) != 0:
        raise SystemExit("trm build-dataset failed")


def _loop_augment(rng: np.random.Generator, board: np.ndarray, solution: np.ndarray):
    """One augmentation, drawn and applied to one example, as the original does it."""
    digit_map = np.pad(rng.permutation(np.arange(1, 10)), (1, 0))
    transpose = rng.random() < 0.5
    row_perm = np.concatenate([band * 3 + rng.permutation(3) for band in rng.permutation(3)])
    col_perm = np.concatenate([stack * 3 + rng.permutation(3) for stack in rng.permutation(3)])
    cells = np.array([row_perm[i // 9] * 9 + col_perm[i % 9] for i in range(81)])

    def apply(grid: np.ndarray) -> np.ndarray:
        grid = grid.T if transpose else grid
        return digit_map[grid.flatten()[cells].reshape(9, 9)]

    return apply(board), apply(solution)


def _loop_split(rows: list[tuple[str, str]], num_aug: int, rng: np.random.Generator, out: Path) -> None:
    inputs, labels, puzzle_indices, group_indices, puzzle_identifiers = [], [], [0], [0], []
    for question, answer in rows:
        board = (np.frombuffer(question.replace(".", "0").encode(), dtype=np.uint8) - ord("0")).reshape(9, 9)
        solution = (np.frombuffer(answer.encode(), dtype=np.uint8) - ord("0")).reshape(9, 9)
        for aug in range(1 + num_aug):
            q, a = (board, solution) if aug == 0 else _loop_augment(rng, board, solution)
            inputs.append(q)
            labels.append(a)
            puzzle_identifiers.append(0)
            puzzle_indices.append(len(inputs))
        group_indices.append(len(puzzle_identifiers))
    out.mkdir(parents=True)
    arrays = {
        # Stacking uint8 originals with int64 augmentations promotes to int64, as in the original.
        "inputs": np.stack(inputs).reshape(-1, 81) + 1,
        "labels": np.stack(labels).reshape(-1, 81) + 1,
        "puzzle_identifiers": np.array(puzzle_identifiers, dtype=np.int32),
        "puzzle_indices": np.array(puzzle_indices, dtype=np.int32),
        "group_indices": np.array(group_indices, dtype=np.int32),
    }
    for name, array in arrays.items():
        np.save(out / f"all__{name}.npy", array)
    groups = len(group_indices) - 1
    metadata = {"pad_id": 0, "ignore_label_id": 0, "blank_identifier_id": 0, "vocab_size": 11, "seq_len": 81}
    metadata |= {"num_puzzle_identifiers": 1, "total_groups": groups, "mean_puzzle_examples": 1}
    metadata |= {"total_puzzles": groups, "sets": ["all"]}
    (out / "dataset.json").write_text(json.dumps(metadata))


def build_loop(source: Path, out: Path, puzzles: int, num_aug: int) -> None:
    with gzip.open(source, "rt", newline="") if source.suffix == ".gz" else open(source, newline="") as f:
        rows = [(row["question"], row["answer"]) for row in csv.DictReader(f)]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(rows))
    # Disjoint splits, as the vectorised build's: a fifth of the rows test, the train puzzles from the rest.
    test = [rows[i] for i in sorted(order[: max(1, len(rows) // 5)])]
    train = [rows[i] for i in order[len(test) :][:puzzles]]
    _loop_split(train, num_aug, rng, out / "train")
    _loop_split(test, 0, rng, out / "test")
    (out / "identifiers.json").write_text('["<blank>"]')


BUILDERS = {"vectorised": build_vectorised, "loop": build_loop}


def run_child(builder: str, source: Path, out: Path, puzzles: int, num_aug: int) -> dict:
    """Run one builder in a fresh interpreter; its own figures come back as JSON on stdout."""
    command = [sys.executable, __file__, "--child", builder, "--source", str(source), "--out", str(out)]
    command += ["--puzzles", str(puzzles), "--num-aug", str(num_aug)]
    result = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["disk_bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return figures


def child(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    BUILDERS[args.child](Path(args.source), Path(args.out), args.puzzles, args.num_aug)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak}))


def generator_rate(count: int = 40) -> float:
    from trm.data.generate import generate_puzzles

    start = time.perf_counter()
    generate_puzzles(count, seed=0)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--puzzles", type=int, default=1000)
    parser.add_argument("--num-aug", type=int, default=1000)
    parser.add_argument("--child", choices=sorted(BUILDERS), help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    with tempfile.TemporaryDirectory(prefix="bench_build_dataset.") as tmp:
        source = SHARED_CSV
        if not source.exists():
            from trm.data.generate import generate_puzzles

            count = args.puzzles * 5 // 4 + 1  # --puzzles of them in the train split, 80% of the file
            print(f"{SHARED_CSV} not found: generating {count} puzzles", file=sys.stderr)
            generated = generate_puzzles(count, seed=0)
            source = Path(tmp) / "generated.csv"
            lines = ["source,question,answer,rating"] + [
                f"gen,{''.join(str(v) if v else '.' for v in q)},{''.join(map(str, a))},{r}"
                for q, a, r in zip(generated.questions, generated.answers, generated.ratings, strict=True)
            ]
            source.write_text("\n".join(lines) + "\n")
        results = {
            name: run_child(name, source, Path(tmp) / name, args.puzzles, args.num_aug) for name in BUILDERS
        }

    print(
        f"\nsource {source.name}: {args.puzzles} puzzles x {1 + args.num_aug} examples (train) + test split"
    )
    print(f"{'builder':<12} {'seconds':>9} {'peak MB':>9} {'disk MB':>9}")
    for name, r in results.items():
        print(f"{name:<12} {r['seconds']:9.2f} {r['peak_rss_bytes'] / 1e6:9.0f} {r['disk_bytes'] / 1e6:9.0f}")
    ratio = results["loop"]["seconds"] / results["vectorised"]["seconds"]
    print(f"speed ratio (loop / vectorised): {ratio:.1f}x")
    print(f"generator: {generator_rate():.1f} puzzles/s (minimal puzzles with unique solutions)")


if __name__ == "__main__":
    main()
