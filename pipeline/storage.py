"""Remote and local storage through fsspec: one place that opens a URL with the job's
storage options, turns a missing backend (s3fs, gcsfs) into a one-line error, and strips
credentials and query tokens from URIs before they reach an output row or a log line.
"""
from __future__ import annotations

import json
import os
import re
from urllib.parse import urlsplit, urlunsplit

import fsspec

# Protocol -> (package, pip extra) of the fsspec backends we document.
BACKENDS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}


class StorageError(ValueError):
    """A storage location cannot be opened (missing backend, bad URL)."""


# user:password@ where the password may hold '/', '?' or '#'. Object stores' URLs name a
# bucket, never a port; elsewhere "host:8080/..." is a port, not a password.
_USERINFO = re.compile(r"^([A-Za-z][\w+.-]*://)[^/:@?#]*:[^@]*?@")
_USERINFO_PORTS = re.compile(r"^([A-Za-z][\w+.-]*://)[^/:@?#]*:(?!\d{1,5}(?:[/?#]|$))[^@]*?@")
_BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2")


def redact_uri(uri: str | None) -> str | None:
    """``uri`` without a ``user:password@`` part and without its query string (pre-signed
    URLs carry their signature and token there). The path and a ``#fragment`` (a row
    index into a Parquet file) are kept: they name the recording, not who may read it."""
    if not uri or "://" not in uri:
        return uri
    # A password may hold '/', '?' or '#' (AWS secret keys hold '/'), which urlsplit reads as
    # the end of the host: drop "user:password@" first. A path with '@' in it (no ':' before
    # its first '/', or a port) is left alone.
    scheme = uri.split("://", 1)[0].lower()
    uri = (_USERINFO if scheme in _BUCKET_SCHEMES else _USERINFO_PORTS).sub(r"\1", uri)
    try:
        parts = urlsplit(uri)
    except ValueError:
        return re.sub(r"//[^/@]*@", "//", uri.split("?", 1)[0])
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", parts.fragment))


_URL = re.compile(r"[A-Za-z][\w+.-]*://[^\s'\"<>]+")


def redact_text(text: str | None) -> str | None:
    """``text`` with every URI in it redacted (an HTTP client's error names the URL it
    fetched, decoded differently from the one it was given)."""
    return _URL.sub(lambda m: redact_uri(m.group()), text) if text else text


def url_to_fs(url: str, options: dict | None = None):
    """(filesystem, path) for ``url`` with the job's storage options; options apply only
    to a remote protocol (the local filesystem takes none)."""
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    kwargs = dict(options or {}) if protocol not in ("file", "local") else {}
    try:
        return fsspec.core.url_to_fs(url, **kwargs)
    except ImportError:
        package, extra = BACKENDS.get(protocol, (None, None))
        if package is None:
            raise StorageError(f"{redact_uri(url)}: no fsspec backend installed for {protocol}://") from None
        raise StorageError(f"{redact_uri(url)}: {protocol}:// needs {package}: "
                           f"pip install 'shardscribe[{extra}]'") from None
    except ValueError as exc:
        raise StorageError(f"{redact_uri(url)}: {exc}") from None


def open_url(url: str, mode: str = "rb", options: dict | None = None):
    fs, path = url_to_fs(url, options)
    return fs.open(path, mode)


def protocol_of(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def use_options(options: dict | None, urls) -> None:
    """Make ``options`` the defaults of the remote protocols of ``urls``, in this process
    (fsspec's per-protocol config) and in the processes it starts (fsspec reads
    ``FSSPEC_<PROTOCOL>`` from the environment when imported), so every fsspec open of the
    job, the source's reader, the audio it names, Ray's readers and the output's writer,
    sees the same endpoint and settings. The options hold no credentials (config.py
    refuses them), so the environment may carry them."""
    if not options:
        return
    for protocol in {protocol_of(u) for u in urls if u} - {"file", "local"}:
        if fsspec.config.conf.get(protocol, {}).items() >= options.items():
            continue
        fsspec.config.conf.setdefault(protocol, {}).update(options)
        os.environ[f"FSSPEC_{protocol.upper()}"] = json.dumps(fsspec.config.conf[protocol])


def options_environment() -> dict[str, str]:
    """The ``FSSPEC_<PROTOCOL>`` variables ``use_options`` set: for a cluster's workers,
    which do not inherit this process's environment."""
    return {k: v for k, v in os.environ.items() if k.startswith("FSSPEC_") and k[7:8] != "_"}


def check_reachable(url: str, options: dict | None = None) -> None:
    """Open ``url``'s filesystem and ask for its parent once: a missing backend, bad
    credentials or an endpoint that does not answer fail here, in one line."""
    fs, path = url_to_fs(url, options)
    if protocol_of(url) in ("file", "local"):
        return
    try:
        fs.exists(path)
    except Exception as exc:
        raise StorageError(f"{redact_uri(url)}: storage not reachable ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None


def utf8_name(name: str) -> tuple[str, str | None]:
    """(text, error): a file name as listed (undecodable bytes arrive as surrogate escapes)
    turned into text that Arrow and JSON accept: the bytes that are not UTF-8 written as
    ``\\xNN``, and an error naming it, since no reader can open the file by that text."""
    try:
        name.encode("utf-8")
        return name, None
    except UnicodeEncodeError:
        text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return text, f"file name is not valid UTF-8: {text}"
