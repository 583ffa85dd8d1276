"""The GCS client behind trm.storage: gcsfs with timeouts and a short, bounded retry, and one clear error.

gcsfs retries every failed request six times over about a minute, logs each traceback, and then raises raw
aiohttp errors; offline or without credentials a command hung for a minute and printed 150 lines. Here each
request has a connect and read timeout, a request that cannot reach GCS is retried for a few seconds, one that
GCS asks us to retry (5xx, 429, a dropped connection) for about 15 s, and then the failure is a
`StorageUnavailable` error: one line with the URL, the cause and what to do.

Every GCS read and write goes through here but one: the run lease (trm/run/lease.py) renews and takes over
RUN_DIR/lease.json with writes conditioned on the object's generation, which gcsfs does not expose (only its
create-if-absent case), so that module uses google-cloud-storage for them, with the same credentials.
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse

import aiohttp
import google.auth.exceptions
import requests.exceptions
from gcsfs.core import GCSFileSystem
from gcsfs.retry import ChecksumError, HttpError

from trm.errors import UserError

CONNECT_TIMEOUT_S = 10.0
# A stalled transfer: no byte for this long. No total limit: a large file may take long on a slow link.
READ_TIMEOUT_S = 120.0
UNREACHABLE_DELAYS_S = (0.5, 1.0)  # cannot connect (offline, DNS, refused): 3 attempts, ~2 s
TRANSIENT_DELAYS_S = (
    1.0,
    2.0,
    4.0,
    8.0,
)  # GCS asks to retry (5xx, 429, dropped connection): 5 attempts, ~15 s
AUTH_RETRIES = 1  # a 401 "Invalid Credentials" once more: the next attempt refreshes an expired token
FIX_CREDENTIALS = "gcloud auth application-default login"
NO_CREDENTIALS = (
    "no Google Cloud credentials for gs:// storage: gcsfs needs Application Default Credentials (not gcloud's "
    f"own login): run `{FIX_CREDENTIALS}`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account key "
    "file; on a TPU VM the VM's service account is used (docs/tpu.md)"
)

_UNREACHABLE = (
    aiohttp.ClientConnectorError,  # refused, DNS failure, TLS handshake
    aiohttp.ConnectionTimeoutError,
    google.auth.exceptions.TransportError,  # the token endpoint cannot be reached
    requests.exceptions.ConnectionError,
)
_TRANSIENT = (
    aiohttp.ClientError,  # dropped connections, read timeouts, truncated bodies (after _UNREACHABLE)
    asyncio.TimeoutError,
    requests.exceptions.RequestException,
    ChecksumError,
)
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_BUCKET_OBJECT = re.compile(r"(?:^|/)b/([^/?]+)(?:/o/([^?]*))?")


class StorageUnavailable(UserError):
    """GCS could not be reached, or refused our credentials: nothing the same command can fix by waiting."""


class StorageAccessDenied(StorageUnavailable, OSError):
    """GCS refused the request (401/403). An OSError whose message starts with "Forbidden", as gcsfs's own:
    gcsfs falls back from a refused object or bucket read to a listing, which an object-only role may allow."""


def _url(path: str, args: tuple, kwargs: dict) -> str:
    """The gs:// URL a gcsfs request is about: from the bucket and object arguments of its path template, or
    from a complete request path (".../b/BUCKET/o/QUOTED-OBJECT?...")."""
    if args:
        bucket, key = args[0], args[1] if len(args) > 1 else kwargs.get("prefix") or ""
    else:
        found = _BUCKET_OBJECT.search(path)
        if not found:
            return path
        bucket, key = found[1], urllib.parse.unquote(found[2] or "")
    return f"gs://{bucket}/{key}".rstrip("/")


def _cause(err: BaseException) -> str:
    """The error in one short line: "HTTP 403: <GCS's message>", or the exception's type and message."""
    if isinstance(err, HttpError):
        text = f"HTTP {err.code}: {str(err.message).removesuffix(f', {err.code}')}"
    elif isinstance(err, OSError) and str(err).startswith("Forbidden"):
        text = f"HTTP 403: {str(err).partition(chr(10))[2]}"  # gcsfs: "Forbidden: <path>\n<GCS's message>"
    else:
        text = f"{type(err).__name__}: {err}"
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


def _classify(err: BaseException) -> str:
    """'denied', 'unreachable', 'transient' or 'other' (not ours to handle: 404, a bad request...)."""
    if isinstance(err, HttpError):
        if err.code in (401, 403):
            return "denied"
        return "transient" if err.code in _RETRY_STATUS else "other"
    if isinstance(err, OSError) and str(err).startswith("Forbidden"):
        return "denied"
    if isinstance(err, requests.exceptions.ProxyError):  # gcsfs's translation of a 502
        return "transient"
    if isinstance(err, (google.auth.exceptions.RefreshError, google.auth.exceptions.DefaultCredentialsError)):
        return "denied"
    if isinstance(err, _UNREACHABLE):
        return "unreachable"
    if isinstance(err, _TRANSIENT):
        return "transient"
    return "other"


class BoundedGCSFileSystem(GCSFileSystem):
    """The plain GCSFileSystem (not the "extended" class gcsfs may register for "gs": that one probes each
    bucket's layout over gRPC, which emulators cannot answer, 60 s per call; our buckets are standard), with
    every request bounded as the module docstring says."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault(
            "requests_timeout",
            aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S),
        )
        super().__init__(*args, **kwargs)

    async def _request(self, method, path, *args, **kwargs):
        attempts = {"unreachable": 0, "transient": 0, "denied": 0}
        while True:
            try:
                # gcsfs's request without its own retry decorator (6 attempts, ~1 min, a logged traceback each).
                return await GCSFileSystem._request.__wrapped__(self, method, path, *args, **kwargs)
            except Exception as err:
                kind = _classify(err)
                if kind == "other":
                    raise
                delays = {"unreachable": UNREACHABLE_DELAYS_S, "transient": TRANSIENT_DELAYS_S}.get(kind, ())
                if kind == "denied" and "Invalid Credentials" in str(err):
                    delays = (0.0,) * AUTH_RETRIES
                if attempts[kind] < len(delays):
                    await asyncio.sleep(delays[attempts[kind]])
                    attempts[kind] += 1
                    continue
                raise self._error(kind, err, method, _url(path, args, kwargs), attempts[kind] + 1) from err

    def _error(self, kind: str, err: Exception, method: str, url: str, tries: int) -> StorageUnavailable:
        cause = _cause(err)
        if kind == "denied":
            bucket = url.removeprefix("gs://").split("/", 1)[0]
            return StorageAccessDenied(
                f"Forbidden: {method} {url} was refused by Google Cloud Storage ({cause}); check network/"
                f"credentials: run `{FIX_CREDENTIALS}` and make sure your account may read and write "
                f"gs://{bucket} (docs/tpu.md, set-up step 4)"
            )
        what = "could not reach" if kind == "unreachable" else "kept failing at"
        return StorageUnavailable(
            f"{method} {url}: {what} Google Cloud Storage at {self._location} after {tries} attempts ({cause}); "
            f"check network/credentials (`{FIX_CREDENTIALS}`), then rerun"
        )
