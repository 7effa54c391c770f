"""The head of an HTTP/1.x request, as the status endpoint (broker.parent.status_http) reads
it: finding where it ends in what arrived, and turning it into a WSGI environ.

Only what a GET needs is read: the request line and the header fields; a body is never
read (the endpoint answers and closes).  Anything malformed raises BadRequest with the
status to answer, never another exception, whatever the bytes.
"""

from __future__ import annotations

import re
import urllib.parse

MAX_HEADER_FIELDS = 100
_END = re.compile(rb"\r?\n\r?\n")
_VERSION = re.compile(r"HTTP/(\d)\.(\d)")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class BadRequest(ValueError):
    """A request the endpoint answers with `status` and closes."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status


def head_end(data: bytes | bytearray) -> int:
    """Where the head ends in `data` (the offset just past its blank line), or -1 while it
    is not whole."""
    found = _END.search(data)
    return -1 if found is None else found.end()


def environ_of(head: bytes, server: tuple[str, int], peer: tuple) -> dict:
    """The WSGI environ of a request head (up to its blank line, as head_end found it)."""
    lines = head.decode("latin-1").splitlines()
    if not lines:
        raise BadRequest("400 Bad Request", "empty request")
    method, path, query, protocol = _request_line(lines[0])
    environ = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
        "SERVER_PROTOCOL": protocol, "SCRIPT_NAME": "", "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]), "REMOTE_ADDR": str(peer[0]) if peer else "",
        "CONTENT_TYPE": "", "CONTENT_LENGTH": "",
    }
    fields = [line for line in lines[1:] if line]
    if len(fields) > MAX_HEADER_FIELDS:
        raise BadRequest("431 Request Header Fields Too Large", "too many header fields")
    for line in fields:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise BadRequest("400 Bad Request", "malformed header field")
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        value = value.strip(" \t")
        environ[key] = f"{environ[key]},{value}" if environ.get(key) else value
    return environ


def _request_line(line: str) -> tuple[str, str, str, str]:
    """(method, decoded path, query string, protocol) of `METHOD TARGET HTTP/x.y`."""
    parts = line.split()
    if len(parts) != 3:
        raise BadRequest("400 Bad Request", "malformed request line")
    method, target, protocol = parts
    version = _VERSION.fullmatch(protocol)
    if version is None or not _TOKEN.fullmatch(method):
        raise BadRequest("400 Bad Request", "malformed request line")
    if version.group(1) != "1":
        raise BadRequest("505 HTTP Version Not Supported", f"{protocol} is not served")
    path, _, query = target.partition("?")
    return method, urllib.parse.unquote(path, "latin-1"), query, protocol
