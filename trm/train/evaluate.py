"""Evaluate a checkpoint at several test-time step counts in one pass (test-time scaling).

    trm evaluate --checkpoint RUN_DIR --data DATA [--steps 16,32,64,128] [--subset N] [--out FILE.json]

--checkpoint: a run dir of `trm train` or `trm import-torch`. The model of its latest checkpoint is used:
  the EMA weights when the run kept an EMA (the output says which: "weights": "ema" or "params").
--data: a staged dataset URL (gs://, file://; fetched into --cache-dir and checked against its manifest),
  a dataset folder built by `trm build-dataset` (--split test or train), or a Sudoku-Extreme style CSV
  (.csv or .csv.gz, columns question,answer).

Every puzzle starts from a fresh carry and runs max(--steps) supervision steps; the carry after step k is
the start of step k + 1, so the figures for every requested count come from the same pass. As in the
original's evaluation, the Q head never stops a puzzle early. For each count k, over the real puzzles:

  exact_accuracy       puzzles whose 81 predicted cells are all right after k steps (the headline metric)
  accuracy             right cells / cells, averaged per puzzle
  q_halt_accuracy      puzzles where (q_halt_logit >= 0) agrees with "exactly right" at step k
  mean_halt_step       mean over puzzles of the first step at which the Q head says halt (q_halt_logit > 0,
                       the training halting rule); a puzzle whose Q head has not said halt by step k counts k
  halted_fraction      puzzles whose Q head said halt within k steps
  halt_exact_accuracy  exact accuracy of the answer at that first halt step (at step k if none): what
                       adaptive halting would score with a budget of k steps
  lm_loss, q_halt_loss per-puzzle mean cross-entropy and Q-halt BCE at step k

The batch is split over all local devices; metrics are computed per puzzle on device and summed on the host
in float64, so results do not depend on the number of devices. Output: a JSON summary (--out FILE.json, or stdout)
and a CSV with one row per step count beside it (FILE.csv).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trm import storage
from trm.data.format import SplitData, load_split, sudoku_metadata
from trm.data.manifest import MANIFEST_NAME
from trm.data.sudoku import read_csv
from trm.data.verify import DATASET_CACHE, fetch_dataset
from trm.errors import UserError
from trm.model.act import act_step, initial_carry
from trm.train.data import IGNORE_LABEL, eval_batches
from trm.train.loss import CROSS_ENTROPY
from trm.train.records import EVAL_STATS
from trm.train.step import Model
from trm.train.weights import RunWeights, load_weights

DEFAULT_STEPS = "16,32,64,128"
# Per-puzzle statistics computed on device, summed over real puzzles on the host.
ROW_STATS = EVAL_STATS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="run dir (local path, file:// or gs://)")
    parser.add_argument("--data", required=True, help="staged dataset URL, built dataset folder, or CSV")
    parser.add_argument(
        "--split", default="test", choices=("test", "train"), help="dataset split (default test)"
    )
    parser.add_argument(
        "--steps",
        default=DEFAULT_STEPS,
        help="comma-separated supervision step counts to report (default %(default)s)",
    )
    parser.add_argument("--subset", type=int, default=None, help="evaluate only the first N puzzles")
    parser.add_argument(
        "--batch-size", type=int, default=256, help="puzzles per batch over all devices (default 256)"
    )
    parser.add_argument(
        "--out", default=None, help="JSON output file (CSV beside it); default: JSON to stdout"
    )
    parser.add_argument(
        "--cache-dir", default=DATASET_CACHE, help="local cache for staged datasets (default %(default)s)"
    )


def parse_steps(text: str) -> tuple[int, ...]:
    """'16,32' -> (16, 32), sorted and deduplicated; UserError on anything but positive integers."""
    try:
        counts = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise UserError(
            f"--steps {text!r}: expected comma-separated positive integers, e.g. 16,32,64"
        ) from None
    if not counts or min(counts) < 1:
        raise UserError(f"--steps {text!r}: expected comma-separated positive integers, e.g. 16,32,64")
    return tuple(sorted(counts))


def load_eval_split(data: str, split: str, cache_dir: str) -> SplitData:
    """The puzzles to evaluate: a Sudoku CSV, a staged dataset (fetched to the cache) or a built dataset folder."""
    if data.endswith((".csv", ".csv.gz")):
        puzzles = read_csv(storage.filesystem(data)[1])
        count = len(puzzles)
        # The dataset format's tokens: 0 = padding, 1 = blank, 2..10 = digits 1..9.
        return SplitData(
            inputs=puzzles.questions + 1,
            labels=puzzles.answers + 1,
            puzzle_identifiers=np.zeros(count, np.int32),
            puzzle_indices=np.arange(count + 1, dtype=np.int32),
            group_indices=np.arange(count + 1, dtype=np.int32),
            metadata=sudoku_metadata(count),
        )
    if not storage.exists(data):
        raise UserError(f"{data}: no such dataset")
    if storage.exists(storage.join(data, MANIFEST_NAME)):
        return load_split(fetch_dataset(data, cache_dir), split)
    return load_split(storage.filesystem(data)[1], split)


def check_compatible(weights: RunWeights, metadata: dict, data: str) -> None:
    """UserError when the data's vocabulary, length or puzzle ids differ from the checkpoint's model."""
    for field in ("vocab_size", "seq_len", "num_puzzle_identifiers"):
        if metadata[field] != getattr(weights.model_cfg, field):
            raise UserError(
                f"{data}: {field} = {metadata[field]}, but the checkpoint's model has "
                f"{field} = {getattr(weights.model_cfg, field)}"
            )


class MultiStepEvaluator:
    """Per-puzzle statistics after each of `counts` supervision steps, from one pass of max(counts) steps.

    Compiled once per batch shape; the batch is sharded over a 1-D mesh of `devices` (default: all local).
    """

    def __init__(self, model: Model, counts: Sequence[int], devices: Sequence[jax.Device] | None = None):
        self.model = model
        self.counts = tuple(sorted(set(counts)))
        self.mesh = Mesh(np.array(list(devices or jax.local_devices())), ("batch",))
        self.rows = NamedSharding(self.mesh, PartitionSpec("batch"))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self._compiled = jax.jit(self._run)

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    def put_weights(self, params: dict, puzzle_emb: np.ndarray, buffers: dict) -> tuple:
        """The weights replicated on every device of the mesh."""
        return jax.device_put((params, puzzle_emb, buffers), self.replicated)

    def __call__(self, weights: tuple, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{statistic: [len(counts), batch rows]} for one batch (rows a multiple of the device count)."""
        stats = self._compiled(*weights, jax.device_put(batch, self.rows))
        return {k: np.asarray(v, np.float64) for k, v in stats.items()}

    def lower(self, weights: tuple, batch: dict):
        """The lowered pass, from arrays placed like `put_weights` and a row-split batch, or abstract ones."""
        return self._compiled.lower(*weights, batch)

    def _run(self, params, puzzle_emb, buffers, batch):
        module = self.model.bind(params, puzzle_emb, buffers)
        max_steps = self.counts[-1]
        labels = batch["labels"]
        mask = labels != IGNORE_LABEL
        cells = mask.sum(-1)
        divisor = jnp.maximum(cells, 1).astype(jnp.float32)
        cross_entropy = CROSS_ENTROPY[module.cfg.loss]
        carry = jax.lax.with_sharding_constraint(initial_carry(module, labels.shape[0]), self.rows)
        no_halt = jnp.zeros(labels.shape[:1], jnp.int32)

        def step(state, t):
            carry, first_halt, exact_at_halt = state
            carry, out = act_step(module, carry, batch, training=False, max_steps=max_steps)
            correct = mask & (jnp.argmax(out.logits, axis=-1) == labels)
            exact = correct.sum(-1) == cells
            q_halt = out.q_halt_logits
            says_halt_first = (first_halt == 0) & (q_halt > 0)
            first_halt = jnp.where(says_halt_first, t, first_halt)
            exact_at_halt = jnp.where(says_halt_first, exact, exact_at_halt)
            halted = first_halt > 0
            target = exact.astype(jnp.float32)
            stats = {
                "exact_accuracy": exact,
                "accuracy": correct.sum(-1) / divisor,
                "q_halt_accuracy": (q_halt >= 0) == exact,
                "mean_halt_step": jnp.where(halted, first_halt, t),
                "halted_fraction": halted,
                "halt_exact_accuracy": jnp.where(halted, exact_at_halt, exact),
                "lm_loss": cross_entropy(out.logits, labels).sum(-1) / divisor,
                "q_halt_loss": jnp.maximum(q_halt, 0)
                - q_halt * target
                + jnp.log1p(jnp.exp(-jnp.abs(q_halt))),
            }
            return (carry, first_halt, exact_at_halt), {k: v.astype(jnp.float32) for k, v in stats.items()}

        _, per_step = jax.lax.scan(
            step, (carry, no_halt, jnp.zeros_like(no_halt, bool)), jnp.arange(1, max_steps + 1)
        )
        picked = np.asarray(self.counts) - 1
        return {k: v[picked] for k, v in per_step.items()}


def evaluate(
    weights: RunWeights,
    split: SplitData,
    counts: Sequence[int],
    batch_size: int,
    subset: int | None = None,
    devices: Sequence[jax.Device] | None = None,
    progress: bool = True,
) -> list[dict]:
    """One record per step count: {"steps": k, "count": puzzles, **ROW_STATS means} (see module docstring)."""
    from tqdm import tqdm

    evaluator = MultiStepEvaluator(Model(weights.model_cfg, seed=0), counts, devices)
    # Every device gets the same number of rows.
    batch_size = math.ceil(batch_size / evaluator.num_devices) * evaluator.num_devices
    on_device = evaluator.put_weights(weights.params, weights.puzzle_emb, weights.buffers)
    total = len(split.inputs) if subset is None else min(subset, len(split.inputs))
    sums = np.zeros((len(evaluator.counts), len(ROW_STATS)))
    count = 0
    bar = tqdm(total=total, desc="evaluate", unit=" puzzles", disable=not progress or None, file=sys.stderr)
    for batch in eval_batches(split, batch_size, limit=total):
        stats = evaluator(on_device, batch.as_dict())
        real = (batch.labels != IGNORE_LABEL).any(-1)  # padding rows have no labels
        sums += np.stack([stats[k][:, real].sum(-1) for k in ROW_STATS], axis=-1)
        count += int(real.sum())
        bar.update(int(real.sum()))
    bar.close()
    return [
        {
            "steps": k,
            "count": count,
            **{name: float(v) / max(count, 1) for name, v in zip(ROW_STATS, row, strict=True)},
        }
        for k, row in zip(evaluator.counts, sums, strict=True)
    ]


def results_csv(results: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(results[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(results)
    return out.getvalue()


def main(args: argparse.Namespace) -> int:
    counts = parse_steps(args.steps)
    if args.subset is not None and args.subset < 1:
        raise UserError(f"--subset {args.subset}: must be >= 1")
    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size}: must be >= 1")
    split = load_eval_split(args.data, args.split, args.cache_dir)
    weights = load_weights(args.checkpoint, seq_len=split.metadata["seq_len"])
    check_compatible(weights, split.metadata, args.data)
    print(
        f"evaluating {args.checkpoint} (step {weights.step}, {weights.source} weights) on "
        f"{jax.local_device_count()} device(s)",
        file=sys.stderr,
    )
    results = evaluate(weights, split, counts, args.batch_size, args.subset)
    summary = {
        "checkpoint": args.checkpoint,
        "checkpoint_step": weights.step,
        "weights": weights.source,
        "data": args.data,
        "split": "csv" if args.data.endswith((".csv", ".csv.gz")) else args.split,
        "subset": args.subset,
        "devices": jax.local_device_count(),
        "results": results,
    }
    text = json.dumps(summary, indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    csv_url = args.out.removesuffix(".json") + ".csv"
    storage.write_text(csv_url, results_csv(results))
    storage.write_text(args.out, text)  # last: its presence means both files are complete
    print(f"wrote {args.out} and {csv_url}", file=sys.stderr)
    return 0
