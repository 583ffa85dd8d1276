"""The study guides (docs/experiments/): generated from config/groups.yaml and the experiment files by `trm guides`,
committed, and checked for staleness."""

from __future__ import annotations

import shutil

import pytest

from trm.cli import main as trm_main
from trm.config import EXPERIMENTS_DIR, load_config
from trm.study.groups import GROUPS_PATH, load_groups
from trm.study.guides import DOCS_DIR, guides
from trm.study.metrics import CURVE_METRICS, RUN_METRICS, TEST_TIME_METRICS


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return guides()


def test_committed_guides_equal_the_regenerated_ones(tmp_path):
    assert trm_main(["guides", "--output", str(tmp_path)]) == 0
    generated = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_text() for p in DOCS_DIR.glob("*.md")}
    assert generated.keys() == committed.keys()
    stale = [name for name in generated if generated[name] != committed[name]]
    assert not stale, f"run `trm guides` to regenerate {stale}"
    assert trm_main(["guides", "--check"]) == 0


def test_a_guide_shows_each_members_values_from_its_experiment_file(generated):
    text = generated["exp06.md"]
    for member in load_groups()[7]["members"]:
        config = load_config(EXPERIMENTS_DIR / f"{member}.yaml")
        batch, micro = config["train"]["global_batch_size"], config["train"]["micro_batches"]
        name = f"**{member}** (baseline)" if member == "exp06_c" else member
        assert f"| {name} | {batch} | {micro} | " in text
    fixed = text.split("## Held fixed")[1].split("## Metrics")[0]
    assert "`data.train_puzzles` 1000" in fixed and "`train.global_batch_size`" not in fixed
    assert "Every batch size reaches test accuracy within 2 points of batch 6144." in text
    assert "each of exp06_a, exp06_b, exp06_d, exp06_e, exp06_f within 0.02 of exp06_c" in text


def test_index_links_every_group(generated):
    for group in load_groups():
        assert f"| [{group['id']}]({group['id']}.md) | {group['title']} |" in generated["README.md"]
        assert f"{group['id']}.md" in generated


def test_check_names_stale_missing_and_unknown_guides(tmp_path, capsys, generated):
    for name, text in generated.items():
        (tmp_path / name).write_text(text)
    assert trm_main(["guides", "--check", "--output", str(tmp_path)]) == 0
    (tmp_path / "exp07.md").write_text("edited by hand\n")
    (tmp_path / "exp08.md").unlink()
    (tmp_path / "exp99.md").write_text("an old group\n")
    capsys.readouterr()
    assert trm_main(["guides", "--check", "--output", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for name in ("exp07.md", "exp08.md", "exp99.md"):
        assert str(tmp_path / name) in err
    assert "exp06.md" not in err
    assert (tmp_path / "exp07.md").read_text() == "edited by hand\n"  # --check writes nothing


def test_guides_follow_the_groups_file(tmp_path, generated):
    config = tmp_path / "config"
    config.mkdir()
    text = GROUPS_PATH.read_text().replace("title: Weight EMA", "title: Weight averaging", 1)
    (config / "groups.yaml").write_text(text)
    shutil.copytree(EXPERIMENTS_DIR, config / "experiments")
    out = tmp_path / "docs"
    assert trm_main(["guides", "--groups", str(config / "groups.yaml"), "--output", str(out)]) == 0
    assert (out / "exp08.md").read_text().startswith("# exp08: Weight averaging\n")
    assert "| [exp08](exp08.md) | Weight averaging |" in (out / "README.md").read_text()
    assert (out / "exp07.md").read_text() == generated["exp07.md"]


def test_index_lists_every_metric_of_the_registry(generated):
    metrics = generated["README.md"].split("## Metrics")[1]
    for table in (RUN_METRICS, CURVE_METRICS, TEST_TIME_METRICS):
        for metric in table.values():
            assert f"| `{metric.key}` | {metric.meaning} | {metric.unit} |" in metrics
    assert (
        "| `step_time_s` | training step time in seconds, global batch / examples per second | s | lower |"
        in metrics
    )
