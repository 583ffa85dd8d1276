"""Benchmark: where the local study's time goes, job by job.

Runs the workflow (`snakemake --cores 2 all`, by default on a representative subset of the smoke study) in a fresh
folder, then breaks each job's wall time into:

- start+imports: from the process's start to the first line of its command (Python and `trm`'s own imports);
- setup: JAX's import and devices, the model and optimizer (compile excluded);
- compile: JAX tracing, lowering and XLA compilation (or persistent-cache reads), with the cache's hits/misses;
- data, init (parameters and optimizer state), train (steps, compile excluded), evaluate (compile excluded),
  checkpoint (saves, the final wait, restores), other (the rest of the process: markers, summaries);
- outside: the job's wall time outside that process (the `trm launch` wrapper, `trm summarize`, the shell);
- and, for the whole run, Snakemake's own time: wall time in which no job ran (its start, DAG, scheduling).

Jobs without a timings record (datasets, analysis) show only their wall time. Timestamps in Snakemake's log have
one-second resolution. Then it runs the same command again and times the rerun, which has nothing to do.

    .venv/bin/python benchmarks/bench_local_study.py [--experiments exp01a exp01c ...|--all] [--cores 2]
        [--folder DIR] [--config KEY=VALUE ...]

User+system CPU of the whole run is printed with the wall time: on a shared machine the CPU time is the steadier
figure.
"""

from __future__ import annotations

import argparse
import datetime
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trm.run.timing import last_record

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# One member of most groups' dimensions, the widest and the largest-batch runs (the costliest), and the baseline.
SUBSET = ["exp01a", "exp01c", "exp01f", "exp02a_06", "exp04a_5000", "exp06_a", "exp06_f"]
COLUMNS = (
    "start+imports",
    "setup",
    "compile",
    "data",
    "init",
    "train",
    "evaluate",
    "checkpoint",
    "other",
    "outside",
)
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def run_snakemake(folder: Path, args: argparse.Namespace) -> tuple[float, float, str]:
    """(wall s, user+system CPU s of it and its children, its log)."""
    config = [] if args.all else [f"experiments=[{','.join(args.experiments)}]"]
    config += [f"results={folder / 'results'}", f"storage={folder / 'storage'}", *args.config]
    command = [SNAKEMAKE, "--cores", str(args.cores), "all", "--config", *config]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        sys.exit(f"snakemake failed ({done.returncode}):\n{log[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, log


def parse_jobs(log: str) -> list[dict]:
    """Each job of Snakemake's log: rule, name (its wildcards), log file, start and end (Unix seconds)."""
    jobs, by_id, stamp, current = [], {}, None, None
    for line in log.splitlines():
        if match := STAMP.match(line.strip()):
            stamp = datetime.datetime.strptime(match[1], "%a %b %d %H:%M:%S %Y").timestamp()
        elif match := re.match(r"^(?:local)?rule (\w+):$", line):
            current = {"rule": match[1], "name": "", "log": None, "start": stamp, "end": None}
            jobs.append(current)
        elif match := re.match(
            r"^Job (\d+): (\w+) (\w+)", line
        ):  # a rule with a message: "Job 3: train exp01a: ..."
            current = {"rule": match[2], "name": match[3], "log": None, "start": stamp, "end": None}
            jobs.append(current)
            by_id[match[1]] = current
        elif current is not None and current["log"] is None and (match := re.search(r"> (\S+) 2>&1$", line)):
            current["log"] = match[1]
        elif current is not None and (match := re.match(r"^\s+(jobid|log|wildcards): (.*)$", line)):
            key, value = match[1], match[2].strip()
            if key == "jobid":
                by_id[value] = current
            elif key == "log":
                current["log"] = value.split(", ")[0]
            else:
                current["name"] = ",".join(part.split("=", 1)[1] for part in value.split(", "))
        elif match := re.match(r"^Finished jobid: (\d+)", line):
            if match[1] in by_id:
                by_id[match[1]]["end"] = stamp
    return [job for job in jobs if job["end"] is not None and job["rule"] != "all"]


def timings_of(log_file: str | None) -> dict | None:
    """The last {"timings": ...} record a job's command printed, if any."""
    if not log_file or not Path(log_file).exists():
        return None
    return last_record(Path(log_file).read_text(errors="replace"))


def breakdown(job: dict) -> dict[str, float] | None:
    """The job's wall seconds by COLUMNS (None without a timings record)."""
    record = timings_of(job["log"])
    if record is None:
        return None
    phases = record["phases"]
    row = {"start+imports": record["start_and_imports_s"] or 0.0}
    row["compile"] = sum(p["compile_s"] for p in phases.values())
    for name in ("setup", "data", "init", "train", "evaluate", "checkpoint", "other"):
        phase = phases.get(name, {"wall_s": 0.0, "compile_s": 0.0})
        row[name] = phase["wall_s"] - phase["compile_s"]
    row["outside"] = max(0.0, (job["end"] - job["start"]) - row["start+imports"] - record["total_s"])
    row["hits"] = sum(p["cache_hits"] for p in phases.values())
    row["misses"] = sum(p["cache_misses"] for p in phases.values())
    return row


def busy_seconds(jobs: list[dict]) -> float:
    """Seconds in which at least one job ran (the union of their intervals)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((j["start"], j["end"]) for j in jobs):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def print_table(jobs: list[dict], wall: float, cpu: float) -> None:
    header = f"{'job':32} {'wall':>6} " + " ".join(f"{c:>13}" for c in COLUMNS) + f" {'cache hit/miss':>14}"
    print(header)
    totals = dict.fromkeys(COLUMNS, 0.0)
    by_rule: dict[str, list[float]] = {}
    for job in jobs:
        seconds = job["end"] - job["start"]
        by_rule.setdefault(job["rule"], []).append(seconds)
        row = breakdown(job)
        name = f"{job['rule']} {job['name']}"[:32]
        if row is None:
            print(f"{name:32} {seconds:6.0f}")
            continue
        for column in COLUMNS:
            totals[column] += row[column]
        cells = " ".join(f"{row[c]:13.1f}" for c in COLUMNS)
        print(f"{name:32} {seconds:6.0f} {cells} {row['hits']:>7}/{row['misses']:<6}")
    print(f"{'sum of timed jobs':32} {'':6} " + " ".join(f"{totals[c]:13.1f}" for c in COLUMNS))
    print("\njob-seconds by rule: " + ", ".join(f"{r} {sum(s):.0f} ({len(s)})" for r, s in by_rule.items()))
    idle = wall - busy_seconds(jobs)
    print(f"snakemake alone (no job running): {idle:.0f} s of {wall:.0f} s wall")
    print(f"whole run: {wall:.0f} s wall, {cpu:.0f} s user+system CPU")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--experiments", nargs="+", default=SUBSET, help="experiment ids (default: %(default)s)"
    )
    parser.add_argument("--all", action="store_true", help="the whole study instead of --experiments")
    parser.add_argument("--cores", type=int, default=2, help="snakemake --cores (default 2)")
    parser.add_argument(
        "--folder", type=Path, default=None, help="results and storage here (default: a temp dir)"
    )
    parser.add_argument("--config", nargs="*", default=[], help="further --config KEY=VALUE for snakemake")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="trm-bench-study-"))
    print(f"study in {folder}", file=sys.stderr)
    wall, cpu, log = run_snakemake(folder, args)
    (folder / "snakemake.log").write_text(log)
    print_table(parse_jobs(log), wall, cpu)
    rerun_wall, rerun_cpu, _ = run_snakemake(folder, args)
    print(f"rerun with nothing changed: {rerun_wall:.1f} s wall, {rerun_cpu:.1f} s user+system CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
