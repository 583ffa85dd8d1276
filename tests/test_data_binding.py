"""Only what trm built is replaced, each puzzle is in a dataset once, and a run is bound to its data (issue 37):
`trm build-dataset --force`, the builder's refusal of repeated puzzles, a run's data settings checked against
its dataset, and the run dir's record of the dataset it trains on (data.json). The trainer's and launcher's
refusals end to end: tests/test_trainer.py; `trm stage --replace`: tests/test_stage.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trm.cli import main as trm
from trm.data import format as fmt
from trm.data.build import _TEST_SUBSAMPLE_STREAM, subsample
from trm.data.generate import generate_puzzles
from trm.data.manifest import read_build_record, scan_local
from trm.data.pool import write_csv
from trm.errors import UserError
from trm.run import layout
from trm.train.run_data import check_resumed_data


@pytest.fixture(scope="module")
def generated():
    return generate_puzzles(20, seed=3)


@pytest.fixture
def small_csv(tmp_path, generated) -> Path:
    write_csv(tmp_path / "puzzles.csv", generated)
    return tmp_path / "puzzles.csv"


def build(*args: str) -> int:
    return trm(["build-dataset", *args])


def _question(grid: np.ndarray) -> str:
    return "".join("." if v == 0 else str(v) for v in grid)


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path below `root` (and `root` itself) with its bytes (None for a folder)."""
    paths = [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]
    return {p.relative_to(root.parent).as_posix(): None if p.is_dir() else p.read_bytes() for p in paths}


def test_existing_output_needs_force_and_force_replaces_only_a_dataset_it_built(tmp_path, small_csv, capsys):
    """--force replaces a dataset trm build-dataset made, as it made it; a folder of the user's (the issue's
    thesis: ch1.tex and figs/), a plain file, a link or a built dataset holding an added file is refused in one
    line naming --output-dir, and nothing of it is touched."""
    out = tmp_path / "ds"
    assert build("--source", str(small_csv), "--output-dir", str(out)) == 0
    first = read_build_record(out)
    assert build("--source", str(small_csv), "--output-dir", str(out), "--seed", "1") == 2
    assert "already exists; pass --force to replace it if it is a dataset" in capsys.readouterr().err
    assert build("--source", str(small_csv), "--output-dir", str(out), "--seed", "1", "--force") == 0
    assert read_build_record(out).hash != first.hash and read_build_record(out) == scan_local(out)

    thesis = tmp_path / "thesis"
    (thesis / "figs").mkdir(parents=True)
    (thesis / "ch1.tex").write_text("\\chapter{One}")
    (thesis / "figs" / "plot.pdf").write_bytes(b"%PDF")
    plain = tmp_path / "notes.txt"
    plain.write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(out)
    added = tmp_path / "added"
    assert build("--source", str(small_csv), "--output-dir", str(added)) == 0
    (added / "train" / "notes.txt").write_text("mine")
    capsys.readouterr()
    cases = {
        thesis: f"--output-dir {thesis} holds no MANIFEST.json: --force replaces only a dataset trm build-dataset made",
        plain: f"--output-dir {plain} is a file: --force replaces only",
        link: f"--output-dir {link} is a link: --force replaces only",
        added: f"--output-dir {added} holds train/notes.txt, not in its MANIFEST.json: --force replaces only",
    }
    for target, message in cases.items():
        before = _tree(target)
        assert build("--source", str(small_csv), "--output-dir", str(target), "--force") == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert _tree(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "added",
        "ds",
        "link",
        "notes.txt",
        "puzzles.csv",
        "thesis",
    ]


def test_a_puzzle_repeated_in_the_dataset_is_refused(tmp_path, generated, capsys):
    """The issue's CSV holding one puzzle 20 times would put it in both splits; a folder whose test.csv repeats
    train puzzles, or a split repeating a puzzle, likewise: one line naming the source and the first puzzle."""
    one = tmp_path / "one.csv"
    write_csv(one, generated.take(np.zeros(20, dtype=int)))
    question = _question(generated.questions[0])
    assert build("--source", str(one), "--output-dir", str(tmp_path / "ds")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"trm build-dataset: error: --source {one}: puzzles repeat in the dataset: 15 repeated within the train "
        f"split, 3 repeated within the test split, 4 in both splits (the first: {question}); a dataset holds each "
        "puzzle once, in one split: remove the repeated rows"
    )
    folder = tmp_path / "src"
    folder.mkdir()
    write_csv(folder / "train.csv", generated.take(np.arange(12)))
    write_csv(folder / "test.csv", generated.take(np.arange(10, 16)))  # 2 of them are train puzzles too
    assert build("--source", str(folder), "--output-dir", str(tmp_path / "ds")) == 2
    assert f"--source {folder}: puzzles repeat in the dataset: 2 in both splits" in capsys.readouterr().err
    # Subsampled away, a repeat is no longer in the dataset: only the puzzles the dataset holds count.
    shared = {q.tobytes() for q in generated.questions[10:12]}

    def kept(seed: int) -> set[bytes]:  # the test puzzles a build with this seed keeps
        test = subsample(generated.take(np.arange(10, 16)), 3, seed, _TEST_SUBSAMPLE_STREAM, "test")
        return {q.tobytes() for q in test.questions}

    seed = next(seed for seed in range(100) if not kept(seed) & shared)
    out = tmp_path / "ds"
    args = [
        "--source",
        str(folder),
        "--test-subsample-size",
        "3",
        "--seed",
        str(seed),
        "--output-dir",
        str(out),
    ]
    assert build(*args) == 0
    assert {(q - 1).tobytes() for q in np.load(fmt.array_path(out, "test", "inputs"))} == kept(seed)


def test_a_runs_data_settings_must_describe_its_train_split(easy_dataset, tmp_path):
    """The issue's `--set data.train_puzzles=100` on a 20-puzzle dataset trained, and config.json recorded 100."""
    train = fmt.load_split(easy_dataset, "train")  # 48 puzzles with 4 augmentations each
    fmt.check_data_settings({"board": "9x9", "train_puzzles": 48, "num_aug": 4}, train, "URL")
    with pytest.raises(UserError) as refused:
        fmt.check_data_settings({"board": "9x9", "train_puzzles": 100, "num_aug": 4}, train, "URL")
    assert str(refused.value) == (
        "data.train_puzzles is 100, but the dataset at URL holds 48 training puzzles (total_groups of its "
        "train/dataset.json): set data.train_puzzles=48, or train on a dataset built with --subsample-size 100"
    )
    with pytest.raises(
        UserError, match=r"^data.num_aug is 1, but the dataset at URL holds 4 augmentations per "
    ):
        fmt.check_data_settings({"board": "9x9", "train_puzzles": 48, "num_aug": 1}, train, "URL")
    # A run's board is its dataset's (the model would train on any seq_len; its config would say another board).
    with pytest.raises(UserError) as refused:
        fmt.check_data_settings({"board": "6x6", "train_puzzles": 48, "num_aug": 4}, train, "URL")
    assert str(refused.value) == (
        "data.board is 6x6, but the dataset at URL holds 9x9 puzzles (seq_len 81 of its train/dataset.json): set "
        "data.board=9x9, or train on a dataset built with --board 6x6"
    )
    # A dataset of another builder whose groups differ in size has no one num_aug to match.
    uneven = tmp_path / "uneven"
    fmt.write_split_arrays(uneven, "train", train.inputs[:6], train.labels[:6], 1)
    np.save(fmt.array_path(uneven, "train", "group_indices"), np.array([0, 1, 6], dtype=np.int32))
    fmt.write_json(uneven / "train" / "dataset.json", fmt.sudoku_metadata(2))
    with pytest.raises(
        UserError, match="holds 0 to 4 augmentations per training puzzle .*: train on a dataset built"
    ):
        fmt.check_data_settings(
            {"board": "9x9", "train_puzzles": 2, "num_aug": 0}, fmt.load_split(uneven, "train"), "URL"
        )


def test_a_run_dir_is_bound_to_the_content_of_its_dataset(tmp_path, easy_data):
    run = str(tmp_path / "run")
    layout.bind_data(run, "file:///a", "1" * 64)
    assert layout.bound_data(run) == {"url": "file:///a", "manifest_sha256": "1" * 64}
    layout.bind_data(run, "gs://b/moved", "1" * 64)  # the same content elsewhere: the same dataset
    record = (tmp_path / "run" / layout.DATA).read_bytes()
    with pytest.raises(layout.RunDirRefused) as refused:
        layout.bind_data(run, "file:///c", "2" * 64)
    assert str(refused.value) == (
        f"{run}/data.json: this run trains on the dataset {'1' * 16} staged at file:///a, not on {'2' * 16} at "
        "--data file:///c: resume it on its own dataset, or use a new --run-dir"
    )
    assert (tmp_path / "run" / layout.DATA).read_bytes() == record

    # Before anything is written to a run dir: one bound to another dataset refuses --data; an unbound one reads
    # nothing (its --data may not even exist yet: the trainer says so, after claiming the run dir).
    with pytest.raises(layout.RunDirRefused, match="data.json: this run trains on the dataset 1111"):
        check_resumed_data(run, easy_data)
    check_resumed_data(str(tmp_path / "new"), str(tmp_path / "no-dataset"))
    (tmp_path / "run" / layout.DATA).write_text('{"url": "file:///a"}')
    with pytest.raises(
        UserError, match=r"data.json: not a data record \(expected an object with manifest_sha256\)"
    ):
        layout.bound_data(run)
    (tmp_path / "run" / layout.DATA).write_text("{trunc")
    with pytest.raises(UserError, match=r"data.json: damaged \(cut short, or edited\?\): not valid JSON"):
        layout.bound_data(run)
    assert json.loads(record) == {"manifest_sha256": "1" * 64, "url": "file:///a"}


def test_smoke_pool_replaces_only_a_pool_it_wrote(tmp_path, generated, capsys):
    """`trm smoke-pool --output-dir DIR` wrote DIR/train.csv and test.csv over whatever was there (say, the
    Sudoku-Extreme download): now only a pool it wrote is replaced; anything else is refused, untouched."""
    pool = ["smoke-pool", "--train", "2", "--test", "1", "--blanks", "30", "--output-dir"]
    mine = tmp_path / "mine"
    mine.mkdir()
    write_csv(mine / "train.csv", generated)
    write_csv(mine / "test.csv", generated.take(np.arange(2)))
    text = (mine / "train.csv").read_text().replace("generated", "sudoku-extreme")  # a user's, not a pool
    (mine / "train.csv").write_text(text)
    assert trm([*pool, str(mine)]) == 2
    err = capsys.readouterr().err
    assert (
        f"{mine / 'train.csv'} exists and is not a pool trm smoke-pool wrote: choose another --output-dir"
        in err
    )
    assert (mine / "train.csv").read_text() == text and len(err.strip().splitlines()) == 1

    ours = tmp_path / "pool"
    assert trm([*pool, str(ours)]) == 0
    assert trm([*pool, str(ours), "--seed", "1"]) == 0  # its own pool: replaced
    assert len((ours / "train.csv").read_text().splitlines()) == 3
