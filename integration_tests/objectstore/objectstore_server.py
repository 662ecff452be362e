#!/usr/bin/env python3
"""The network side of ObjectStoreFileSystem's ``http://`` store: objects in this process's
memory, reached by a Spark driver and its executors over HTTP — a cluster's checkpoint with no
disk shared between its nodes (integration_tests/test_your_cluster.py runs it in a container).

    objectstore_server.py --port 9000

GET/PUT/DELETE ``/o/KEY`` (an object, whole), GET ``/stat/KEY`` (``size<TAB>mtime-ms``), GET
``/list?prefix=P`` (``KEY<TAB>size<TAB>mtime-ms`` lines, sorted, keys URL-encoded); 404 where
there is no such object. Standard library only."""

from __future__ import annotations

import argparse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote_plus, unquote_plus, urlsplit

OBJECTS: dict[str, tuple[bytes, int]] = {}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _key(self, prefix: str) -> str:
        return unquote_plus(urlsplit(self.path).path[len(prefix):])

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urlsplit(self.path).path
        with LOCK:
            if path == "/list":
                prefix = parse_qs(urlsplit(self.path).query).get("prefix", [""])[0]
                lines = [f"{quote_plus(k)}\t{len(v)}\t{t}\n" for k, (v, t) in sorted(OBJECTS.items())
                         if k.startswith(prefix)]
                return self._answer(200, "".join(lines).encode())
            if path.startswith("/stat/"):
                found = OBJECTS.get(self._key("/stat/"))
                return self._answer(404) if found is None else self._answer(200, f"{len(found[0])}\t{found[1]}".encode())
            if path.startswith("/o/"):
                found = OBJECTS.get(self._key("/o/"))
                return self._answer(404) if found is None else self._answer(200, found[0])
            if path == "/health":
                return self._answer(200, b"ok")
        self._answer(400)

    def do_PUT(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with LOCK:
            OBJECTS[self._key("/o/")] = (body, int(time.time() * 1000))
        self._answer(200)

    def do_DELETE(self) -> None:  # noqa: N802
        with LOCK:
            gone = OBJECTS.pop(self._key("/o/"), None)
        self._answer(404 if gone is None else 200)

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--host", default="0.0.0.0")
    args = parser.parse_args()
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
