"""Each host's own log file in the run dir (logs/host-{i}.log), so a failed host's output outlives its VM.

Everything the process writes to sys.stdout and sys.stderr is also kept in memory and rewritten whole to the
log file at each `flush()` (GCS objects cannot be appended to). The file is written only after `attach()`:
the trainer attaches once the run dir is known to belong to this run, so a refused run writes nothing there.
A relaunch appends: the earlier attempts' text is read at `attach()` and kept in front of a header line
(ATTEMPT_HEADER) that starts this attempt's output. Output of C++ code (XLA, the JAX coordination service) goes
to the terminal only. A terminal that went away (the pipe of a killed launcher) is replaced by /dev/null: the
trainer's output still reaches the log file, and a clean stop stays clean instead of ending in BrokenPipeError.
"""

from __future__ import annotations

import io
import os
import socket
import sys
import time

from trm import storage

ATTEMPT_HEADER = "===== {time} {host} pid {pid}: this attempt's output (earlier attempts above) =====\n"


class _Tee(io.TextIOBase):
    def __init__(self, stream, sink: list[str]) -> None:
        self.stream = stream
        self.sink = sink

    def write(self, text: str) -> int:
        self.sink.append(text)
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        """The reader of our terminal pipe is gone: send the file descriptor (also C++ output, and Python's
        final flush at exit) to /dev/null, as Python's documentation advises for SIGPIPE."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


class HostLog:
    """Captures this process's stdout and stderr; `flush()` writes them to the attached log file URL."""

    def __init__(self, flush_every_s: float = 30.0) -> None:
        self.flush_every_s = flush_every_s
        self.url: str | None = None
        self._earlier = ""  # the log file's text from earlier attempts
        self._chunks: list[str] = []
        self._last_flush = time.time()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self._chunks)
        sys.stderr = _Tee(sys.stderr, self._chunks)

    def attach(self, url: str) -> None:
        """Write to `url` from now on, after what earlier attempts wrote there."""
        if storage.exists(url):
            header = ATTEMPT_HEADER.format(
                time=time.strftime("%Y-%m-%d %H:%M:%S"), host=socket.gethostname(), pid=os.getpid()
            )
            # Damaged bytes (a write cut short inside a character) must not cost the run its log.
            self._earlier = storage.read_bytes(url).decode("utf-8", errors="replace") + header
        self.url = url
        self.flush()

    def flush(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self.url is not None:
            storage.write_text(self.url, self._earlier + "".join(self._chunks))
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
