"""Where a process's wall time goes: its start and imports, named phases, and JAX's compilations inside them.

    timings = Timings()               # first thing in a command's main: the time before it is start + imports
    with timings.phase("data"):
        ...
    print(json.dumps({"timings": timings.record()}), file=sys.stderr)

Compilations are JAX's own monitoring events (tracing, lowering, XLA compile or a persistent-cache read), summed
per phase, with the persistent compilation cache's hits and misses: a warm cache shows as hits and little compile
time. benchmarks/bench_local_study.py reads these records from the study's job logs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

# JAX's duration events of one compilation: trace to jaxpr, lower to MLIR, compile (or read the persistent cache).
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
CACHE_EVENTS = {
    "/jax/compilation_cache/cache_hits": "cache_hits",
    "/jax/compilation_cache/cache_misses": "cache_misses",
}


def process_start_time() -> float | None:
    """This process's start as a Unix time (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/stat") as stream:
            ticks = int(stream.read().rpartition(")")[2].split()[19])  # field 22: start time since boot
        with open("/proc/stat") as stream:
            boot = next(int(line.split()[1]) for line in stream if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return None


class Timings:
    """Wall seconds per phase of this process, and the compile seconds and cache hits/misses inside each."""

    def __init__(self) -> None:
        self.created = time.time()
        started = process_start_time()
        self.start_and_imports = None if started is None else max(0.0, self.created - started)
        self.phases: dict[str, dict[str, float]] = {}
        self._current = "other"
        self._nested: list[float] = []  # per open phase: seconds of the phases nested in it
        self._listening = False

    def _listen(self) -> None:
        """Register JAX's monitoring listeners (once; JAX is imported by then, as the phases compute)."""
        if self._listening:
            return
        from jax import monitoring

        def on_duration(event: str, seconds: float, **_kwargs) -> None:
            if event in COMPILE_EVENTS:
                self._entry(self._current)["compile_s"] += seconds

        def on_event(event: str, **_kwargs) -> None:
            if event in CACHE_EVENTS:
                self._entry(self._current)[CACHE_EVENTS[event]] += 1

        monitoring.register_event_duration_secs_listener(on_duration)
        monitoring.register_event_listener(on_event)
        self._listening = True

    def _entry(self, name: str) -> dict[str, float]:
        return self.phases.setdefault(
            name, {"wall_s": 0.0, "compile_s": 0.0, "cache_hits": 0, "cache_misses": 0}
        )

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the wall time of the block (and compilations in it) under `name`. Phases may repeat and nest: a
        nested phase's time counts for it alone, not for the phase around it."""
        started = time.time()
        outer, self._current = self._current, name
        self._nested.append(0.0)
        try:
            self._listen()  # the first phase imports JAX's monitoring, hence JAX: counted in that phase
            yield
        finally:
            elapsed = time.time() - started
            self._entry(name)["wall_s"] += elapsed - self._nested.pop()
            if self._nested:
                self._nested[-1] += elapsed
            self._current = outer

    def record(self) -> dict:
        """{"start_and_imports_s", "total_s" (since this object was made), "phases": {name: {wall_s, compile_s,
        cache_hits, cache_misses}}}; time in no phase is under "other"."""
        total = time.time() - self.created
        other = self._entry("other")
        other["wall_s"] = max(0.0, total - sum(p["wall_s"] for n, p in self.phases.items() if n != "other"))
        return {"start_and_imports_s": self.start_and_imports, "total_s": total, "phases": self.phases}


def last_record(log: str) -> dict | None:
    """The last {"timings": ...} record printed in `log` (a process's output), if any."""
    records = [
        json.loads(line[line.index("{") :])["timings"] for line in log.splitlines() if '{"timings"' in line
    ]
    return records[-1] if records else None
