"""Print a dataset's splits (examples, puzzles, groups; shape and dtype of every array), its provenance and
its content hash, and check the hash against the one recorded in dataset.json.

The content hash is the SHA-256 of the manifest `sha256sum train/*.npy test/*.npy` run inside the dataset
folder (so `sha256sum train/*.npy test/*.npy | sha256sum` reproduces it). Exit code 1 if it does not match
the recorded one, 2 if a file is missing or malformed. Datasets of the original builder have no recorded
hash; they are reported as such.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trm.data import format as fmt
from trm.errors import UserError

_PROVENANCE = (
    "builder",
    "source",
    "test_source",
    "seed",
    "subsample_size",
    "test_subsample_size",
    "num_aug",
    "min_difficulty",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset_dir", help="dataset folder (holding train/ and test/)")


def main(args: argparse.Namespace) -> int:
    dataset_dir = Path(args.dataset_dir)
    if not dataset_dir.is_dir():
        raise UserError(f"{dataset_dir}: no such dataset folder")
    recorded = set()
    for split in fmt.SPLITS:
        data = fmt.load_split(dataset_dir, split)
        print(
            f"{split}: {len(data.inputs)} examples, {len(data.puzzle_identifiers)} puzzles, "
            f"{len(data.group_indices) - 1} groups"
        )
        for name in fmt.ARRAY_NAMES:
            array = getattr(data, name)
            print(f"  {name:<20} shape {list(array.shape)!s:<14} dtype {array.dtype}")
        recorded.add(data.metadata.get("content_sha256"))
    metadata = fmt.read_metadata(dataset_dir, "train")
    provenance = ", ".join(f"{key}={metadata[key]}" for key in _PROVENANCE if key in metadata)
    print(f"provenance: {provenance or 'none recorded (original builder?)'}")

    digest = fmt.content_hash(dataset_dir)
    print(f"content sha256: {digest}")
    if recorded == {None}:
        print("recorded sha256: none (dataset.json has no content_sha256)")
        return 0
    if recorded != {digest}:
        shown = ", ".join(sorted(str(r) for r in recorded))
        print(
            f"recorded sha256: {shown}: MISMATCH (the files changed after the build, or the splits come from different builds)"
        )
        return 1
    print("recorded sha256: matches")
    return 0
