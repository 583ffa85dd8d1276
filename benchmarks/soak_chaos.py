"""Soak: the chaos study (tests/chaos.py) with more runs and more faults, drawn at random from a seed.

Runs the study once undisturbed, then again and again with a new random set of faults each round until
--minutes have passed (at least one round), and prints per fault what was injected and what it triggered
(relaunches, resumes from step N, retries), then per round whether every run's parameters and reported figures
were bit-identical to the undisturbed study's, with wall times. Exit code 1 when a round did not finish or
differed.

    .venv/bin/python benchmarks/soak_chaos.py [--seed 0] [--runs 4] [--minutes 10] [--slices 2]
        [--faults-per-run 3] [--controller-kills] [--folder DIR]

Everything runs on this machine: the fake gcloud's slices are local processes (tests/fake_gcloud/gcloud), storage
is the GCS emulator. Faults a round may draw: preempt, kill-host, notice, kill-launcher, gcloud (describe: 503,
429, network, a call that hangs past the launcher's 3 s gcloud timeout; create, delete, ssh: 503, 429,
network), and with --controller-kills one kill-controller in half the rounds (snakemake killed, unlocked and
restarted: each restarted launcher takes its run's lease over and stops the trainers its dead predecessor left
on the slice, with a checkpoint, before it resumes; docs/tpu.md, "Faults a study survives"). Not drawn: a hung ssh or create call, which the launcher waits out for 30 or 5
minutes by design (installing a slice takes minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))  # the chaos study's helpers and the fakes live with the tests

TPU = {"gcloud_timeout_seconds": 3, "stale_after_seconds": 30}
TOTAL_STEPS = 180  # of a chaos run (tests/chaos.py EXPERIMENT), a checkpoint every 20
GCLOUD_FAULTS = [
    *(f"describe {kind}" for kind in ("unavailable", "throttled", "network", "timeout")),
    *(
        f"{verb} {kind}"
        for verb in ("create", "delete", "ssh")
        for kind in ("unavailable", "throttled", "network")
    ),
]
STOPPING_KINDS = ["preempt", "kill-host", "notice", "kill-launcher"]


def draw_faults(rng: random.Random, experiments: list[str], per_run: int, controller: bool) -> list:
    """`per_run` faults per run at increasing steps (gcloud ones among them), and with `controller` one
    controller kill in half the rounds."""
    from chaos import Fault

    faults = []
    for exp in experiments:
        steps = sorted(rng.sample(range(10, TOTAL_STEPS - 20, 10), per_run))
        for step in steps:
            kind = rng.choice([*STOPPING_KINDS, "gcloud"])
            if kind == "gcloud":
                faults.append(Fault(kind, exp, step, f"{rng.choice(GCLOUD_FAULTS)} {rng.randint(1, 3)}"))
            else:
                faults.append(
                    Fault(kind, exp, step, str(rng.randint(0, 1)) if kind in ("kill-host", "notice") else "")
                )
    if controller and rng.random() < 0.5:
        faults.append(
            Fault("kill-controller", rng.choice(experiments), rng.randrange(20, TOTAL_STEPS - 20, 10))
        )
    return faults


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the faults drawn (default 0)")
    parser.add_argument("--runs", type=int, default=4, help="runs (experiments) in the study (default 4)")
    parser.add_argument("--slices", type=int, default=2, help="slices in the pool, 2 hosts each (default 2)")
    parser.add_argument("--faults-per-run", type=int, default=3, help="faults drawn per run (default 3)")
    parser.add_argument(
        "--minutes", type=float, default=10, help="keep starting rounds until then (default 10)"
    )
    parser.add_argument("--controller-kills", action="store_true", help="also kill snakemake (see above)")
    parser.add_argument("--folder", type=Path, help="keep the studies here (default: a temporary folder)")
    args = parser.parse_args()
    if not 1 <= args.runs <= 26 or args.slices < 1 or args.faults_per_run < 0:
        parser.error("--runs must be 1..26, --slices >= 1, --faults-per-run >= 0")

    folder = args.folder or Path(tempfile.mkdtemp(prefix="soak-chaos-"))
    folder.mkdir(parents=True, exist_ok=True)
    # As tests/conftest.py does for the suite: one XLA cache and dataset cache for every process, cheap compiles.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(folder / "xla-cache"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("TRM_CACHE_DIR", str(folder / "datasets"))
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_llvm_disable_expensive_passes=true"
    import gcs_emulator  # points every GCS client at the emulator's port: before trm.storage is used
    from chaos import Chaos, fingerprint, make_study
    from fake_tpu import cloud_env, make_fake_pypi

    from trm import storage

    server = gcs_emulator.start_emulator(folder / "fake-gcs-server.log")
    try:
        bucket = f"soak-{os.getpid()}"
        storage.filesystem(f"gs://{bucket}")[0].mkdir(bucket)
        (folder / "pypi").mkdir(exist_ok=True)
        pypi = make_fake_pypi(folder / "pypi")

        def env(name: str) -> dict[str, str]:
            """A cloud of the study's own: a fault one round left unused never reaches the next."""
            return {**cloud_env(folder / f"cloud-{name}", pypi, dict(os.environ)), "FAKE_TPU_DEVICES": "2"}

        slices = lambda name: tuple(f"soak{os.getpid()}-{name}-{n}" for n in range(args.slices))  # noqa: E731

        started = time.time()
        reference = make_study(
            folder / "reference", f"gs://{bucket}/reference", slices("ref"), args.runs, env("ref"), TPU
        )
        if Chaos(reference, []).run(timeout=3600) != 0:
            print(f"the undisturbed study failed: {reference.root}/snakemake-0.log", file=sys.stderr)
            return 1
        expected = fingerprint(reference)
        print(f"undisturbed study, {args.runs} runs on {args.slices} slices: {time.time() - started:.0f} s\n")

        rounds = []
        while not rounds or time.time() - started < args.minutes * 60:
            n = len(rounds)
            rng = random.Random(args.seed * 1000 + n)
            study = make_study(
                folder / f"round-{n}",
                f"gs://{bucket}/round-{n}",
                slices(f"r{n}"),
                args.runs,
                env(f"r{n}"),
                TPU,
            )
            faults = draw_faults(rng, study.experiments, args.faults_per_run, args.controller_kills)
            print(f"round {n}: {len(faults)} faults (seed {args.seed}, round {n})")
            round_started = time.time()
            chaos = Chaos(study, faults, say=lambda line: print(f"  {line}", flush=True))
            rc = chaos.run(timeout=3600)
            wall = time.time() - round_started
            for fault in chaos.report():
                print(f"  {fault.kind} on {fault.run} at step >= {fault.at_step}: {fault.what}")
                for line in fault.triggered or ["(nothing logged)"]:
                    print(f"      -> {line}")
            missed = [f"{f.kind} {f.run}@{f.at_step}" for f in faults if f.injected_at is None]
            same = rc == 0 and fingerprint(study) == expected
            verdict = (
                "bit-identical to the undisturbed study" if same else f"DIFFERENT or unfinished (exit {rc})"
            )
            print(
                f"  round {n}: {verdict}; {wall:.0f} s"
                + (f"; not injected: {', '.join(missed)}" if missed else "")
            )
            rounds.append({"round": n, "exit": rc, "identical": same, "wall_s": wall, "faults": len(faults)})
        print(json.dumps({"seed": args.seed, "runs": args.runs, "rounds": rounds, "folder": str(folder)}))
        return 0 if all(r["identical"] for r in rounds) else 1
    finally:
        gcs_emulator.stop_emulator(server)


if __name__ == "__main__":
    sys.exit(main())
