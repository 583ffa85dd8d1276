"""`trm build-dataset` and `trm dataset-info` end to end, and the format reader `load_split`."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest

from trm.cli import main as trm
from trm.data import format as fmt
from trm.data.generate import generate_puzzles
from trm.data.manifest import read_build_record, scan_local
from trm.data.sudoku import consistent, read_csv, valid_solutions
from trm.errors import UserError

ORIGINAL_FIELDS = {
    "pad_id": 0,
    "ignore_label_id": 0,
    "blank_identifier_id": 0,
    "vocab_size": 11,
    "seq_len": 81,
    "num_puzzle_identifiers": 1,
    "mean_puzzle_examples": 1,
    "sets": ["all"],
}


def _grid_text(grid: np.ndarray, blank: str) -> str:
    return "".join(blank if v == 0 else str(v) for v in grid)


def write_csv(path: Path, puzzles, ratings: list[str] | None = None) -> Path:
    lines = ["source,question,answer,rating"]
    for i, (q, a) in enumerate(zip(puzzles.questions, puzzles.answers, strict=True)):
        rating = str(puzzles.ratings[i]) if ratings is None else ratings[i]
        lines.append(f"gen,{_grid_text(q, '.')},{_grid_text(a, '')},{rating}")
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)
    return path


@pytest.fixture(scope="module")
def generated():
    return generate_puzzles(20, seed=3)


@pytest.fixture
def small_csv(tmp_path, generated) -> Path:
    return write_csv(tmp_path / "puzzles.csv", generated)


def build(*args: str) -> int:
    return trm(["build-dataset", *args])


def read_split(out: Path, split: str) -> dict[str, np.ndarray]:
    return {name: np.load(fmt.array_path(out, split, name)) for name in fmt.ARRAY_NAMES}


def check_split(out: Path, split: str, groups: int, group_size: int) -> dict[str, np.ndarray]:
    """Every file, field, dtype and shape of one split, and every example a valid completed Sudoku."""
    arrays = read_split(out, split)
    examples = groups * group_size
    assert arrays["inputs"].dtype == arrays["labels"].dtype == np.uint8
    assert arrays["inputs"].shape == arrays["labels"].shape == (examples, 81)
    for name in ("puzzle_identifiers", "puzzle_indices", "group_indices"):
        assert arrays[name].dtype == np.int32
    np.testing.assert_array_equal(arrays["puzzle_identifiers"], np.zeros(examples))
    np.testing.assert_array_equal(arrays["puzzle_indices"], np.arange(examples + 1))
    np.testing.assert_array_equal(arrays["group_indices"], np.arange(groups + 1) * group_size)
    metadata = json.loads((out / split / "dataset.json").read_text())
    assert metadata.items() >= ORIGINAL_FIELDS.items()
    assert metadata["total_groups"] == metadata["total_puzzles"] == groups
    # Tokens: inputs 1 = blank, 2..10 = digits; labels 2..10; each label a valid grid consistent with its input.
    inputs, labels = arrays["inputs"], arrays["labels"]
    assert inputs.min() >= 1 and inputs.max() <= 10 and labels.min() >= 2 and labels.max() <= 10
    assert valid_solutions(labels - 1).all()
    assert consistent(inputs - 1, labels - 1).all()
    givens = (inputs > 1).sum(axis=1).reshape(groups, group_size)
    assert (givens == givens[:, :1]).all()
    return arrays


def test_build_from_real_csv(tmp_path, sudoku_data):
    source = sudoku_data / "magictour_top1465_first400.csv.gz"
    out = tmp_path / "ds"
    args = ["--source", str(source), "--subsample-size", "100", "--num-aug", "10", "--seed", "1"]
    assert build(*args, "--output-dir", str(out)) == 0
    assert sorted(p.name for p in out.iterdir()) == ["MANIFEST.json", "identifiers.json", "test", "train"]
    assert json.loads((out / "identifiers.json").read_text()) == ["<blank>"]
    for split in fmt.SPLITS:
        assert sorted(p.name for p in (out / split).iterdir()) == sorted(
            [f"all__{name}.npy" for name in fmt.ARRAY_NAMES] + ["dataset.json"]
        )
    train = check_split(out, "train", groups=100, group_size=11)
    test = check_split(out, "test", groups=400 // 5, group_size=1)

    # Example 0 of each group is an original puzzle; train and test come from disjoint rows of the file.
    rows = read_csv(source)
    originals = {
        (q + 1).tobytes(): (a + 1).tobytes() for q, a in zip(rows.questions, rows.answers, strict=True)
    }
    train_originals = train["inputs"][::11]
    assert all(
        originals[q.tobytes()] == a.tobytes()
        for q, a in zip(train_originals, train["labels"][::11], strict=True)
    )
    assert all(q.tobytes() in originals for q in test["inputs"])
    assert not {q.tobytes() for q in train_originals} & {q.tobytes() for q in test["inputs"]}

    metadata = fmt.read_metadata(out, "train")
    assert metadata["source"] == "magictour_top1465_first400.csv.gz"
    assert (metadata["seed"], metadata["subsample_size"], metadata["num_aug"]) == (1, 100, 10)
    assert metadata["builder"].startswith("trm ")
    # The build record lists every other file the build wrote, with their checksums as they are on disk.
    record = read_build_record(out)
    assert record == scan_local(out) and len(record.entries) == 13

    # Same inputs and seed: byte-identical files; another seed: different data.
    assert build(*args, "--output-dir", str(tmp_path / "again")) == 0
    for path in sorted(out.rglob("*")):
        if path.is_file():
            assert path.read_bytes() == (tmp_path / "again" / path.relative_to(out)).read_bytes(), path
    other = tmp_path / "other"
    assert build(*args[:-1], "2", "--output-dir", str(other)) == 0
    assert read_build_record(other).hash != record.hash
    assert not np.array_equal(read_split(other, "train")["inputs"], train["inputs"])


def test_build_from_folder_with_subsamples(tmp_path, generated):
    folder = tmp_path / "src"
    folder.mkdir()
    write_csv(folder / "train.csv.gz", generated.take(np.arange(12)))
    write_csv(folder / "test.csv", generated.take(np.arange(12, 20)))
    small, large = tmp_path / "small", tmp_path / "large"
    common = ["--source", str(folder), "--num-aug", "5", "--test-subsample-size", "3"]
    assert build(*common, "--subsample-size", "4", "--output-dir", str(small)) == 0
    assert build(*common, "--subsample-size", "8", "--output-dir", str(large)) == 0
    small_train = check_split(small, "train", groups=4, group_size=6)
    large_train = check_split(large, "train", groups=8, group_size=6)
    # Nested: the 4-puzzle build is exactly the first 4 groups of the 8-puzzle build.
    np.testing.assert_array_equal(small_train["inputs"], large_train["inputs"][: 4 * 6])
    test = check_split(small, "test", groups=3, group_size=1)
    held_out = {(q + 1).tobytes() for q in generated.questions[12:]}
    assert {q.tobytes() for q in test["inputs"]} <= held_out


def test_single_file_split_and_test_source(tmp_path, generated, small_csv):
    out = tmp_path / "ds"
    assert build("--source", str(small_csv), "--output-dir", str(out)) == 0
    train, test = read_split(out, "train"), read_split(out, "test")
    assert (len(train["inputs"]), len(test["inputs"])) == (16, 4)  # 20% of 20 for test
    all_questions = {(q + 1).tobytes() for q in generated.questions}
    split = [q.tobytes() for q in train["inputs"]] + [q.tobytes() for q in test["inputs"]]
    assert set(split) == all_questions and len(split) == 20

    test_csv = write_csv(tmp_path / "held_out.csv", generate_puzzles(2, seed=99))
    out2 = tmp_path / "ds2"
    assert build("--source", str(small_csv), "--test-source", str(test_csv), "--output-dir", str(out2)) == 0
    assert len(read_split(out2, "train")["inputs"]) == 20
    assert len(read_split(out2, "test")["inputs"]) == 2
    assert fmt.read_metadata(out2, "test")["test_source"] == "held_out.csv"


def test_min_difficulty_keeps_rated_puzzles(tmp_path, generated):
    train_csv = write_csv(tmp_path / "train.csv", generated)
    held_out = generate_puzzles(6, seed=98)  # other puzzles: a dataset holds each puzzle in one split
    test_csv = write_csv(tmp_path / "test.csv", held_out)
    threshold = min(int(np.median(generated.ratings)), int(held_out.ratings.max()))
    out = tmp_path / "ds"
    assert (
        build(
            "--source",
            str(train_csv),
            "--test-source",
            str(test_csv),
            "--min-difficulty",
            str(threshold),
            "--output-dir",
            str(out),
        )
        == 0
    )
    kept = generated.questions[generated.ratings >= threshold] + 1
    assert 0 < len(kept) < len(generated)
    np.testing.assert_array_equal(read_split(out, "train")["inputs"], kept)


def test_generate_source(tmp_path):
    out = tmp_path / "ds"
    assert build("--source", "generate:8", "--num-aug", "3", "--seed", "4", "--output-dir", str(out)) == 0
    train = check_split(out, "train", groups=8, group_size=4)
    test = check_split(out, "test", groups=2, group_size=1)
    assert not {q.tobytes() for q in train["inputs"][::4]} & {q.tobytes() for q in test["inputs"]}
    assert fmt.read_metadata(out, "train")["source"] == "generate:8"


def test_hf_source_without_network_fails_fast_and_clearly(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRM_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "ds"
    start = time.monotonic()
    assert build("--source", "hf:trm-tests/no-such-dataset", "--output-dir", str(out)) == 2
    assert time.monotonic() - start < 15
    err = capsys.readouterr().err
    assert (
        "cannot download https://huggingface.co/datasets/trm-tests/no-such-dataset/resolve/main/train.csv"
        in err
    )
    assert "--source" in err
    assert not out.exists()
    assert not (tmp_path / "cache" / "hf").exists()  # nothing left behind, not even a folder


BAD_ROWS = {
    "short question": ("gen,{q_short},{a},5", "question has 80 characters, expected 81"),
    "bad question character": ("gen,{q_x},{a},5", "question has 'x' at position 1"),
    "zero in question": ("gen,{q_zero},{a},5", "question has '0' at position 1"),
    "bad answer character": ("gen,{q},{a_dot},5", "answer has '.' at position 1"),
    "inconsistent answer": ("gen,{q_wrong},{a},5", "answer does not match the question's given digit"),
    "invalid solution": (
        "gen,{q_blank},{a_swapped},5",
        "answer is not a valid Sudoku solution: digit {a1} appears 2 times in column 1",
    ),
    "missing field": ("gen,{q},{a}", "expected 4 fields"),
    "bad rating": ("gen,{q},{a},hard", "rating 'hard' is not an integer"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows_are_reported_with_file_and_line(tmp_path, generated, capsys, case):
    q, a = generated.questions[0], generated.answers[0]
    first_given = int(np.flatnonzero(q)[0])
    wrong = q.copy()
    wrong[first_given] = wrong[first_given] % 9 + 1
    swapped = a.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    fields = {
        "q": _grid_text(q, "."),
        "a": _grid_text(a, ""),
        "q_short": _grid_text(q, ".")[:80],
        "q_x": "x" + _grid_text(q, ".")[1:],
        "q_zero": "0" + _grid_text(q, ".")[1:],
        "a_dot": "." + _grid_text(a, "")[1:],
        "q_wrong": _grid_text(wrong, "."),
        "q_blank": "." * 81,
        "a_swapped": _grid_text(swapped, ""),
    }
    row, message = BAD_ROWS[case]
    good = f"gen,{fields['q']},{fields['a']},3"
    path = tmp_path / "bad.csv"
    # The bad row is on line 4: header, two good rows, then it.
    path.write_text(
        "\n".join(["source,question,answer,rating", good, good, row.format(**fields), good]) + "\n"
    )
    out = tmp_path / "out" / "ds"
    assert build("--source", str(path), "--output-dir", str(out)) == 2
    err = capsys.readouterr().err
    assert f"{path}, line 4: {message.format(a1=a[1])}" in err
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "line 1: file is empty"),
        ("source,question,rating\n", "line 1: missing column(s) answer"),
        ("source,question,answer,rating\n", "line 2: no puzzles after the header"),
        (
            "q\x1b[31m,a\x00\n",
            r"line 1: missing column(s) question, answer; expected the header source,"
            r"question,answer,rating, found q\x1b[31m,a\x00",
        ),  # escaped, not sent to the terminal
    ],
)
def test_bad_files_are_reported(tmp_path, capsys, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    out = tmp_path / "ds"
    assert build("--source", str(path), "--output-dir", str(out)) == 2
    assert f"{path}, {message}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]


def test_existing_output_needs_force(tmp_path, small_csv, capsys):
    out = tmp_path / "ds"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert build("--source", str(small_csv), "--output-dir", str(out)) == 2
    assert "already exists" in capsys.readouterr().err and (out / "keep.txt").exists()
    # --force replaces only a dataset trm build-dataset made (tests/test_data_binding.py): not this folder.
    assert build("--source", str(small_csv), "--output-dir", str(out), "--force") == 2
    assert "holds no MANIFEST.json" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "puzzles.csv"]


def test_subsample_larger_than_split_is_an_error(tmp_path, small_csv, capsys):
    assert (
        build("--source", str(small_csv), "--subsample-size", "17", "--output-dir", str(tmp_path / "ds")) == 2
    )
    assert "subsample size 17 exceeds the 16 puzzles of the train split" in capsys.readouterr().err


def write_original_dataset(out: Path, generated) -> None:
    """A dataset as the original builder writes it: int64 train tokens, uint8 test, no provenance fields."""
    for split, dtype, group_size in (("train", np.int64, 2), ("test", np.uint8, 1)):
        questions = np.repeat(generated.questions[:4], group_size, axis=0)
        answers = np.repeat(generated.answers[:4], group_size, axis=0)
        fmt.write_split_arrays(
            out, split, (questions + 1).astype(dtype), (answers + 1).astype(dtype), group_size
        )
        metadata = fmt.sudoku_metadata(4)
        (out / split / "dataset.json").write_text(json.dumps(metadata))  # original key order, no hash
    (out / "identifiers.json").write_text('["<blank>"]')


def test_load_split_reads_the_original_int64_format(tmp_path, generated, capsys):
    out = tmp_path / "original"
    write_original_dataset(out, generated)
    train = fmt.load_split(out, "train")
    assert train.inputs.dtype == np.int64 and isinstance(train.inputs, np.memmap)
    assert train.inputs.shape == (8, 81) and len(train.group_indices) == 5
    np.testing.assert_array_equal(train.labels[::2], generated.answers[:4] + 1)
    test = fmt.load_split(out, "test", mmap=False)
    assert test.inputs.dtype == np.uint8 and not isinstance(test.inputs, np.memmap)
    assert "builder" not in test.metadata

    assert trm(["dataset-info", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "train: 8 examples, 8 puzzles, 4 groups" in printed
    assert "inputs               shape [8, 81]        dtype int64" in printed
    assert "build record: none (no MANIFEST.json" in printed


def test_load_split_errors_name_the_file(tmp_path, generated):
    out = tmp_path / "original"
    write_original_dataset(out, generated)
    (out / "test" / "all__labels.npy").unlink()
    with pytest.raises(UserError, match=r"test/all__labels\.npy: missing dataset file"):
        fmt.load_split(out, "test")
    (out / "train" / "dataset.json").write_text("{not json")
    with pytest.raises(
        UserError, match=r"train/dataset\.json: damaged \(cut short, or edited\?\): not valid JSON"
    ):
        fmt.load_split(out, "train")
    metadata = fmt.sudoku_metadata(4)
    del metadata["seq_len"]
    (out / "train" / "dataset.json").write_text(json.dumps(metadata))
    with pytest.raises(UserError, match=r"train/dataset\.json: missing field 'seq_len'"):
        fmt.load_split(out, "train")
    metadata = fmt.sudoku_metadata(3)  # disagrees with the 4 groups on disk
    (out / "train" / "dataset.json").write_text(json.dumps(metadata))
    with pytest.raises(UserError, match=r"train/all__group_indices\.npy: expected 4 offsets"):
        fmt.load_split(out, "train")
    inputs = out / "test" / "all__inputs.npy"
    inputs.write_bytes(b"\x80\x04garbage, not an array")  # np.load would unpickle it
    with pytest.raises(UserError, match=r"all__inputs\.npy: not a NumPy \.npy file.*trm build-dataset"):
        fmt.load_split(out, "test")
    np.save(inputs, np.array([{"a": 1}], dtype=object))
    with pytest.raises(UserError, match=r"all__inputs\.npy: holds Python objects, not integer tokens"):
        fmt.load_split(out, "test")


def test_dataset_info_prints_and_checks_the_build_record(tmp_path, small_csv, capsys):
    out = tmp_path / "ds"
    assert build("--source", str(small_csv), "--num-aug", "2", "--output-dir", str(out)) == 0
    record = read_build_record(out)
    assert f"manifest {record.hash[:16]} (13 files)" in capsys.readouterr().out
    assert trm(["dataset-info", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "train: 48 examples, 48 puzzles, 16 groups" in printed
    assert "test: 4 examples, 4 puzzles, 4 groups" in printed
    assert "labels               shape [48, 81]       dtype uint8" in printed
    assert "group_indices        shape [17]           dtype int32" in printed
    assert f"build record {record.hash[:16]}: matches (13 files" in printed
    assert "source=puzzles.csv" in printed and "num_aug=2" in printed

    labels_path = fmt.array_path(out, "test", "labels")
    labels = np.load(labels_path)
    labels[0, 0] = labels[0, 0] % 10 + 1
    np.save(labels_path, labels)
    (out / "train" / "dataset.json").write_text((out / "train" / "dataset.json").read_text() + " ")
    assert trm(["dataset-info", str(out)]) == 1
    printed = capsys.readouterr().out
    assert f"build record {record.hash[:16]}: MISMATCH" in printed
    assert "  test/all__labels.npy: altered: checksum" in printed
    assert "  train/dataset.json: wrong size" in printed and "rebuild with trm build-dataset" in printed
    assert trm(["dataset-info", str(tmp_path / "nowhere")]) == 2
