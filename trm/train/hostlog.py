"""Each host's own log file in the run dir (logs/host-{i}.log), so a failed host's output outlives its VM.

Everything the process writes to sys.stdout and sys.stderr is also kept in memory and rewritten whole to the
log file at each `flush()` (GCS objects cannot be appended to). The file is written only after `attach()`:
the trainer attaches once the run dir is known to belong to this run, so a refused run writes nothing there.
Output of C++ code (XLA, the JAX coordination service) goes to the terminal only.
"""

from __future__ import annotations

import io
import sys
import time

from trm import storage


class _Tee(io.TextIOBase):
    def __init__(self, stream, sink: list[str]) -> None:
        self.stream = stream
        self.sink = sink

    def write(self, text: str) -> int:
        self.sink.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


class HostLog:
    """Captures this process's stdout and stderr; `flush()` writes them to the attached log file URL."""

    def __init__(self, flush_every_s: float = 30.0) -> None:
        self.flush_every_s = flush_every_s
        self.url: str | None = None
        self._chunks: list[str] = []
        self._last_flush = time.time()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self._chunks)
        sys.stderr = _Tee(sys.stderr, self._chunks)

    def attach(self, url: str) -> None:
        self.url = url
        self.flush()

    def flush(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self.url is not None:
            storage.write_text(self.url, "".join(self._chunks))
            self._last_flush = time.time()

    def maybe_flush(self) -> None:
        """Flush if the last flush is older than `flush_every_s` (call it often; it is cheap otherwise)."""
        if time.time() - self._last_flush >= self.flush_every_s:
            self.flush()

    def close(self) -> None:
        """Final flush (errors reported, not raised: the run's outcome matters more) and restore the streams."""
        try:
            self.flush()
        except Exception as err:  # noqa: BLE001 - a log upload failure must not hide the run's own error
            print(f"could not write the host log {self.url}: {err}", file=self._saved[1])
        sys.stdout, sys.stderr = self._saved
