"""config/groups.yaml refused by load_groups when a criterion, a plot or a guide field is wrong: each error names
the file, the group and the field."""

from __future__ import annotations

import pytest
from workflow_support import groups_file

from trm.errors import UserError
from trm.study.groups import load_groups


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("check: at_most\n", "check: below\n", "criteria[1]: check: unknown kind 'below' (one of within,"),
        (
            "members: [exp01d, exp01e, exp01f]\n        against",
            "members: [exp01d, exp01z, exp01f]\n        against",
            "criteria[1]: members: 'exp01z' is not a member of the group",
        ),
        (
            "metric: test_exact_accuracy\n        members: [exp01d",
            "metric: test_accuracy\n        members: [exp01d",
            "criteria[1]: metric 'test_accuracy' is not a column of the results table",
        ),
        (
            "metric: test_exact_accuracy\n        members: [exp01d",
            "metric: test_exact_accuracy_raw\n        members: [exp01d",
            "criteria[1]: metric 'test_exact_accuracy_raw' is not a column of the results table",
        ),
        (
            "        margin: 0.01\n",
            "        tolerence: 0.01\n",
            "criteria[1]: unknown field 'tolerence' for check",
        ),
        ("        value: 0.854\n", "", "criteria[0]: check 'at_least' needs exactly one of 'against'"),
        (  # the key's name before issue 41
            "members: [exp01a]\n        against: [exp01c]",
            "members: [exp01a]\n        reference: [exp01c]",
            "criteria[2]: unknown field 'reference' for check 'at_most' (allowed: text, check, metric, members, "
            "against, value, margin); 'reference' is now called 'against'",
        ),
        (  # a criterion never compares a member with itself
            "members: [exp01a]\n        against: [exp01c]",
            "members: [exp01c]\n        against: [exp01c]",
            "criteria[2]: against: 'exp01c' would be compared with itself only; name another member",
        ),
        (
            "    how_to_read: >-\n      Test exact accuracy against parameter",
            "    how_to_read: >-\n      Test",
            None,
        ),
        (
            "    hypothesis: >-\n      On 1000",
            "    hypothesys: >-\n      On 1000",
            "missing field 'hypothesis'",
        ),
    ],
)
def test_bad_criteria_or_guide_fields_are_refused_naming_file_group_and_field(tmp_path, old, new, message):
    path = groups_file(tmp_path, old, new)
    if message is None:  # a harmless edit: the copy itself loads
        assert len(load_groups(path, path.parent / "experiments")) == 14
        return
    with pytest.raises(UserError) as err:
        load_groups(path, path.parent / "experiments")
    assert f"{path}: group 'exp01': " in str(err.value) and message in str(err.value)


def test_best_of_a_metric_or_a_pareto_front_needs_a_better_direction(tmp_path):
    old = "check: best_is_one_of\n        metric: test_exact_accuracy\n        members: [exp03a"
    path = groups_file(tmp_path, old, old.replace("test_exact_accuracy", "parameter_count"))
    with pytest.raises(UserError) as err:
        load_groups(path, path.parent / "experiments")
    assert (
        "group 'exp03': criteria[1]: check 'best_is_one_of' needs a metric with a better direction; "
        in str(err.value)
    )
    pareto = "{x: examples_per_second, y: test_exact_accuracy, log_x: false, kind: pareto}"
    (tmp_path / "pareto").mkdir()
    path = groups_file(tmp_path / "pareto", pareto, pareto.replace("examples_per_second", "effective_depth"))
    with pytest.raises(UserError) as err:
        load_groups(path, path.parent / "experiments")
    assert "group 'exp03': a pareto plot needs metrics with a better direction on both axes; x " in str(
        err.value
    )


def test_monotonic_needs_a_direction(tmp_path):
    path = groups_file(tmp_path, "direction: increasing\n        tolerance: 0.01\n", "tolerance: 0.01\n")
    with pytest.raises(UserError) as err:
        load_groups(path, path.parent / "experiments")
    assert "group 'exp02a': criteria[0]: missing field 'direction' for check 'monotonic'" in str(err.value)
