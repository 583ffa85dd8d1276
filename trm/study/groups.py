"""The study's 14 experiment groups (config/groups.yaml): members, baseline, varied keys, main plots, study guide
(hypothesis, expected result, how to read the plot) and success criteria."""

from __future__ import annotations

from pathlib import Path

from trm.config import CONFIG_DIR, EXPERIMENTS_DIR, config_value, experiment_ids, read_mapping, schema
from trm.config.schema import text
from trm.errors import UserError
from trm.study.metrics import CRITERION_METRICS, PLOT_METRICS

GROUPS_PATH = CONFIG_DIR / "groups.yaml"
# The table's group of the reference experiments (groups.yaml `references`): drawn in every group's plots.
REFERENCE_GROUP = "reference"
REFERENCE_FIELDS = ("id", "label")
GROUP_FIELDS = (
    "id",
    "title",
    "varies",
    "members",
    "baseline",
    "plots",
    "hypothesis",
    "expected",
    "how_to_read",
    "criteria",
)
OPTIONAL_GROUP_FIELDS = ("fixed", "exceptions")
# A member that must also change a key its group does not vary declares it, with the reason (`exceptions`).
EXCEPTION_FIELDS = ("member", "keys", "reason")
GUIDE_FIELDS = ("hypothesis", "expected", "how_to_read", "fixed")  # free text of the study guide
PLOT_FIELDS = ("x", "y", "log_x", "kind")
PLOT_KINDS = ("line", "pareto", "curve")
CRITERION_FIELDS = ("text", "check", "metric", "members")
# Check kind -> (fields it requires, fields it allows) besides CRITERION_FIELDS. The checks themselves are
# trm.analysis.verdicts.CHECKS; config/groups.yaml's header says what each one means.
CHECK_FIELDS = {
    "within": (("tolerance",), ("against", "value")),
    "at_least": ((), ("against", "value", "margin")),
    "at_most": ((), ("against", "value", "margin")),
    "best_is_one_of": ((), ()),
    "monotonic": (("direction",), ("tolerance",)),
}
COMPARISONS = ("within", "at_least", "at_most")  # compare members with others (`against`) or a `value`
DIRECTIONS = ("increasing", "decreasing")


def config_keys() -> list[str]:
    """Every dotted leaf key of the config schema, e.g. 'arch.hidden_size'."""

    def walk(node: dict, prefix: str) -> list[str]:
        if "properties" not in node:
            return [prefix[:-1]]
        return [key for name, child in node["properties"].items() for key in walk(child, f"{prefix}{name}.")]

    return walk(schema(), "")


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _criterion_errors(criterion, where: str, members: list[str]) -> list[str]:
    """What is wrong with one success criterion of a group (nothing when it is well formed)."""
    if not isinstance(criterion, dict):
        return [f"{where}: expected a mapping with the fields {', '.join(CRITERION_FIELDS)}"]
    errors = [f"{where}: missing field {f!r}" for f in CRITERION_FIELDS if f not in criterion]
    if errors:
        return errors
    kind = criterion["check"]
    if kind not in CHECK_FIELDS:
        return [f"{where}: check: unknown kind {kind!r} (one of {', '.join(CHECK_FIELDS)})"]
    required, optional = CHECK_FIELDS[kind]
    allowed = CRITERION_FIELDS + required + optional
    errors += [f"{where}: missing field {f!r} for check {kind!r}" for f in required if f not in criterion]
    errors += [
        f"{where}: unknown field {f!r} for check {kind!r} (allowed: {', '.join(allowed)})"
        + ("; 'reference' is now called 'against'" if f == "reference" else "")
        for f in criterion
        if f not in allowed
    ]
    if not isinstance(criterion["text"], str) or not criterion["text"].strip():
        errors.append(f"{where}: text must be a sentence saying the criterion in words")
    if criterion["metric"] not in CRITERION_METRICS:
        errors.append(
            f"{where}: metric {criterion['metric']!r} is not a column of the results table "
            f"(one of {', '.join(CRITERION_METRICS)})"
        )
    elif kind == "best_is_one_of" and CRITERION_METRICS[criterion["metric"]].higher_is_better is None:
        errors.append(
            f"{where}: check 'best_is_one_of' needs a metric with a better direction; "
            f"{criterion['metric']!r} has none (trm/study/metrics.py)"
        )
    for field in ("members", "against"):
        if field not in criterion:
            continue
        listed = criterion[field]
        if not isinstance(listed, list) or not listed:
            errors.append(f"{where}: {field} must be a non-empty list of members of the group")
            continue
        errors += [
            f"{where}: {field}: {m!r} is not a member of the group" for m in listed if m not in members
        ]
    if isinstance(criterion.get("against"), list) and isinstance(criterion["members"], list):
        errors += [  # a criterion never compares a member with itself (trm/analysis/judge.py)
            f"{where}: against: {m!r} would be compared with itself only; name another member"
            for m in criterion["members"]
            if criterion["against"] and set(criterion["against"]) <= {m}
        ]
    if kind in COMPARISONS and ("against" in criterion) == ("value" in criterion):
        errors.append(
            f"{where}: check {kind!r} needs exactly one of 'against' (members) or 'value' (a number)"
        )
    for field in ("value", "margin", "tolerance"):
        if field in criterion and not _is_number(criterion[field]):
            errors.append(f"{where}: {field} must be a number, not {criterion[field]!r}")
        elif field == "tolerance" and field in criterion and criterion[field] < 0:
            errors.append(f"{where}: tolerance must be >= 0, not {criterion[field]!r}")
    if kind == "monotonic":
        if criterion.get("direction") not in DIRECTIONS:
            errors.append(f"{where}: direction must be one of {', '.join(DIRECTIONS)}")
        if isinstance(criterion["members"], list) and len(criterion["members"]) < 2:
            errors.append(f"{where}: members: a monotonic check needs at least two members")
    return errors


def format_number(x: float) -> str:
    """A figure of a criterion or a verdict: thousands separated when large, else 4 significant digits."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def signed(margin: float) -> str:
    return f"{'-' if margin < 0 else '+'} {format_number(abs(margin))}"


def describe(criterion: dict) -> str:
    """The machine check of a criterion in words (its metric aside), e.g. 'each of exp01d, exp01e <= exp01c + 0.01'."""
    kind, members = criterion["check"], ", ".join(criterion["members"])
    if kind == "best_is_one_of":
        best = "highest" if CRITERION_METRICS[criterion["metric"]].higher_is_better else "lowest"
        return f"the {best} of all the group's members is one of {members}"
    if kind == "monotonic":
        wrong_way = "falls" if criterion["direction"] == "increasing" else "rises"
        tolerance = format_number(criterion.get("tolerance", 0))
        return f"over {members}, in this order, it never {wrong_way} by more than {tolerance}"
    if "value" in criterion:
        compared = format_number(criterion["value"])
    elif len(criterion["against"]) == 1:
        compared = criterion["against"][0]
    else:
        compared = f"the highest of {', '.join(criterion['against'])}"
    each = "each of " if len(criterion["members"]) > 1 else ""
    if kind == "within" and set(criterion["members"]) & set(criterion.get("against", [])):
        # Never against itself: a member of its `against` list is judged against the highest of the others.
        tolerance = format_number(criterion["tolerance"])
        return f"{each}{members} at most {tolerance} below {compared} other than itself"
    if kind == "within":
        return f"{each}{members} within {format_number(criterion['tolerance'])} of {compared}"
    margin = criterion.get("margin", 0)
    limit = f"{compared} {signed(margin)}" if margin else compared
    return f"{each}{members} {'>=' if kind == 'at_least' else '<='} {limit}"


def _guide_errors(group: dict, name: str) -> list[str]:
    errors = [
        f"{name}: {field} must be non-empty text"
        for field in GUIDE_FIELDS
        if field in group and (not isinstance(group[field], str) or not group[field].strip())
    ]
    criteria = group["criteria"]
    if not isinstance(criteria, list) or not criteria:
        return errors + [f"{name}: criteria must be a non-empty list of success criteria"]
    for i, criterion in enumerate(criteria):
        errors += _criterion_errors(criterion, f"{name}: criteria[{i}]", group["members"])
    return errors


def _exception_errors(group: dict, name: str, keys: set[str]) -> list[str]:
    exceptions = group.get("exceptions", [])
    if not isinstance(exceptions, list):
        return [
            f"{name}: exceptions must be a list of mappings with the fields {', '.join(EXCEPTION_FIELDS)}"
        ]
    errors = []
    for i, exception in enumerate(exceptions):
        where = f"{name}: exceptions[{i}]"
        if not isinstance(exception, dict) or sorted(exception) != sorted(EXCEPTION_FIELDS):
            errors.append(f"{where}: expected exactly the fields {', '.join(EXCEPTION_FIELDS)}")
            continue
        if exception["member"] not in group["members"]:
            errors.append(f"{where}: {exception['member']!r} is not a member of the group")
        if not isinstance(exception["keys"], list) or not exception["keys"]:
            errors.append(f"{where}: keys must be a non-empty list of config keys")
        else:
            errors += [f"{where}: unknown config key {k!r}" for k in exception["keys"] if k not in keys]
        if not isinstance(exception["reason"], str) or not exception["reason"].strip():
            errors.append(f"{where}: reason must say, in text, why the member also changes these keys")
    return errors


def varies_errors(
    groups: list[dict], configs: dict[str, dict], base: dict, path: str | Path, experiments_dir: str | Path
) -> list[str]:
    """What `varies` promises, checked on the members' resolved configs (`configs`, by id): each baseline equals
    config/base.yaml (`base`), and each member differs from its baseline only in the keys its group varies and
    those of its declared exceptions, so that a plot's x axis is the only difference between its points."""
    keys = config_keys()
    errors = []
    for group in groups:
        baseline_id = group["baseline"]
        baseline = configs[baseline_id]
        changed = [k for k in keys if config_value(baseline, k) != config_value(base, k)]
        if changed:
            errors.append(
                f"{Path(experiments_dir) / baseline_id}.yaml: the baseline of group {group['id']!r} changes "
                f"{', '.join(changed)}; a baseline is config/base.yaml as it is (no overrides)"
            )
        for member in group["members"]:
            allowed = set(group["varies"]) | {
                k for e in group.get("exceptions", []) if e["member"] == member for k in e["keys"]
            }
            out = [
                k
                for k in keys
                if k not in allowed and config_value(configs[member], k) != config_value(baseline, k)
            ]
            if out:
                changes = ", ".join(
                    f"{k} = {text(config_value(configs[member], k))} (baseline {baseline_id}: "
                    f"{text(config_value(baseline, k))})"
                    for k in out
                )
                errors.append(
                    f"{Path(experiments_dir) / member}.yaml: {changes}, but group {group['id']!r} varies only "
                    f"{', '.join(group['varies'])} ({path}): change only those, or declare the key under the "
                    "group's exceptions with a reason"
                )
    return errors


def load_groups(path: str | Path = GROUPS_PATH, experiments_dir: str | Path = EXPERIMENTS_DIR) -> list[dict]:
    """Read and check the group table: fields present, names known, every experiment in exactly one group,
    guides and success criteria well formed."""
    path = Path(path)
    groups = read_mapping(path, "groups file").get("groups")
    if not isinstance(groups, list):
        raise UserError(f"{path}: expected a top-level 'groups' list")
    keys = set(config_keys())
    errors = []
    owner: dict[str, str] = {}
    for n, group in enumerate(groups):
        name = f"{path}: group {group.get('id', n)!r}" if isinstance(group, dict) else f"{path}: group {n}"
        if not isinstance(group, dict):
            errors.append(f"{name}: expected a mapping with the fields {', '.join(GROUP_FIELDS)}")
            continue
        missing = [f"{name}: missing field {f!r}" for f in GROUP_FIELDS if f not in group]
        unknown = [
            f"{name}: unknown field {f!r} (allowed: {', '.join(GROUP_FIELDS + OPTIONAL_GROUP_FIELDS)})"
            for f in group
            if f not in GROUP_FIELDS + OPTIONAL_GROUP_FIELDS
        ]
        if missing or unknown:
            errors += missing + unknown
            continue
        errors += [f"{name}: unknown config key {k!r} in varies" for k in group["varies"] if k not in keys]
        errors += _exception_errors(group, name, keys)
        if group["baseline"] not in group["members"]:
            errors.append(f"{name}: baseline {group['baseline']!r} is not a member")
        for member in group["members"]:
            if not member.startswith(group["id"]):
                errors.append(f"{name}: member {member!r} does not start with the group id")
            if member in owner:
                errors.append(f"{name}: member {member!r} already belongs to group {owner[member]!r}")
            owner[member] = group["id"]
        for plot in group["plots"]:
            if not isinstance(plot, dict) or sorted(plot) != sorted(PLOT_FIELDS):
                errors.append(f"{name}: a plot needs exactly the fields {', '.join(PLOT_FIELDS)}")
                continue
            if plot["x"] not in keys | set(PLOT_METRICS) | {"member"}:
                errors.append(f"{name}: plot x {plot['x']!r} is neither a config key, a metric nor 'member'")
            if plot["y"] not in keys | set(PLOT_METRICS):
                errors.append(f"{name}: plot y {plot['y']!r} is neither a config key nor a metric")
            if plot["kind"] not in PLOT_KINDS:
                errors.append(f"{name}: plot kind {plot['kind']!r} is not one of {', '.join(PLOT_KINDS)}")
            elif plot["kind"] == "pareto":
                errors += [
                    f"{name}: a pareto plot needs metrics with a better direction on both axes; {axis} "
                    f"{plot[axis]!r} has none (trm/study/metrics.py)"
                    for axis in ("x", "y")
                    if plot[axis] not in PLOT_METRICS or PLOT_METRICS[plot[axis]].higher_is_better is None
                ]
        errors += _guide_errors(group, name)
    files = set(experiment_ids(experiments_dir))
    errors += [
        f"{path}: member {m!r} has no file {m}.yaml in {experiments_dir}" for m in sorted(set(owner) - files)
    ]
    # An experiment file no group lists is not an error here: the plan runs only group members and says so.
    if errors:
        raise UserError("\n".join(errors))
    return groups


def load_references(
    path: str | Path = GROUPS_PATH,
    experiments_dir: str | Path = EXPERIMENTS_DIR,
    groups: list[dict] | None = None,
) -> list[dict]:
    """The reference experiments of groups.yaml (`references`: id and label): run with the study, in no group,
    drawn in every group's plots as a labelled line. `groups`: the file's groups when the caller has loaded them."""
    path = Path(path)
    references = read_mapping(path, "groups file").get("references", [])
    if not isinstance(references, list):
        raise UserError(f"{path}: references: expected a list of mappings with the fields id, label")
    files = set(experiment_ids(experiments_dir))
    groups = load_groups(path, experiments_dir) if groups is None else groups
    members = {m for group in groups for m in group["members"]}
    for n, ref in enumerate(references):
        where = f"{path}: references[{n}]"
        if not isinstance(ref, dict) or sorted(ref) != sorted(REFERENCE_FIELDS):
            raise UserError(f"{where}: expected exactly the fields {', '.join(REFERENCE_FIELDS)}")
        if ref["id"] not in files:
            raise UserError(f"{where}: {ref['id']!r} has no file {ref['id']}.yaml in {experiments_dir}")
        if ref["id"] in members:
            raise UserError(
                f"{where}: {ref['id']!r} is a group member; a reference stands outside the groups"
            )
    return references
