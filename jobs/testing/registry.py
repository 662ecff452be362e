"""A Confluent Schema Registry double on 127.0.0.1 that enforces HTTP basic auth: for testing
registry access with credentials (which confluent-kafka's ``mock://`` client never checks).

It answers the REST paths confluent-kafka's ``SchemaRegistryClient`` calls on ctiflow's paths:

| method and path | client call | answer |
| --- | --- | --- |
| ``POST /subjects/{s}/versions`` | ``register_schema`` | ``{"id"}``: one id per distinct schema text |
| ``POST /subjects/{s}`` | ``lookup_schema`` | the subject's version of that schema, else 404 (40403) |
| ``GET /schemas/ids/{id}`` | ``get_schema`` | ``{"schema"}``, else 404 (40403) |
| ``GET /subjects`` | ``get_subjects`` | the subjects' names |
| ``GET /subjects/{s}/versions`` | ``get_versions`` | the subject's versions, else 404 (40401) |
| ``GET /subjects/{s}/versions/{v}`` | ``get_version`` (``v``: a number, ``latest``) | ``{"subject", "version", "id", "schema"}`` |

Every request without the ``Authorization: Basic`` header of a known user and password is answered
401 (error code 401) and counted in :attr:`RegistryDouble.refused`; every answered one is recorded
in :attr:`RegistryDouble.requests` as ``(method, path, user)``. Schemas are kept as the text they were
registered with (Avro only); no compatibility checks, no deletes, no contexts.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class RegistryDouble:
    """The registry on ``http://127.0.0.1:<port>`` (:attr:`url`) while the context is entered;
    ``users``: user → password. Thread-safe; the server runs in a daemon thread and is shut down
    on exit."""

    def __init__(self, users: dict[str, str]):
        self.users = dict(users)
        self.requests: list[tuple[str, str, str]] = []
        self.refused = 0
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}  # schema text → id
        self._subjects: dict[str, list[int]] = {}  # subject → ids by version (version = index + 1)
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def url_with(self, user: str) -> str:
        """:attr:`url` with ``user:password@`` in it."""
        return f"http://{user}:{self.users[user]}@127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "RegistryDouble":
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                double._serve(self, "GET")

            def do_POST(self):
                double._serve(self, "POST")

            def log_message(self, *args):  # no request lines on the test's stderr
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="registry-double", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _user(self, header: str | None) -> str | None:
        if not header or not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return user if user in self.users and self.users[user] == password else None

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        path = urlsplit(handler.path).path
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        user = self._user(handler.headers.get("Authorization"))
        if user is None:
            with self._lock:
                self.refused += 1
            return self._answer(handler, 401, {"error_code": 401, "message": "Unauthorized"})
        with self._lock:
            self.requests.append((method, path, user))
            status, answer = self._route(method, [unquote(p) for p in path.strip("/").split("/")], body)
        self._answer(handler, status, answer)

    def _route(self, method: str, parts: list[str], body: bytes) -> tuple[int, object]:
        if method == "POST" and len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
            text = json.loads(body)["schema"]
            schema_id = self._ids.setdefault(text, len(self._ids) + 1)
            versions = self._subjects.setdefault(parts[1], [])
            if schema_id not in versions:
                versions.append(schema_id)
            return 200, {"id": schema_id}
        if method == "POST" and len(parts) == 2 and parts[0] == "subjects":
            schema_id = self._ids.get(json.loads(body)["schema"])
            versions = self._subjects.get(parts[1], [])
            if schema_id not in versions:
                return 404, {"error_code": 40403, "message": "Schema not found"}
            return 200, self._version(parts[1], versions.index(schema_id) + 1)
        if method == "GET" and len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
            for text, schema_id in self._ids.items():
                if schema_id == int(parts[2]):
                    return 200, {"schema": text}
            return 404, {"error_code": 40403, "message": "Schema not found"}
        if method == "GET" and parts == ["subjects"]:
            return 200, sorted(self._subjects)
        if method == "GET" and len(parts) in (3, 4) and parts[0] == "subjects" and parts[2] == "versions":
            versions = self._subjects.get(parts[1])
            if not versions:
                return 404, {"error_code": 40401, "message": f"Subject '{parts[1]}' not found."}
            if len(parts) == 3:
                return 200, list(range(1, len(versions) + 1))
            number = re.fullmatch(r"\d+", parts[3])
            wanted = len(versions) if parts[3] == "latest" else int(parts[3]) if number else 0
            if not 1 <= wanted <= len(versions):
                return 404, {"error_code": 40402, "message": "Version not found."}
            return 200, self._version(parts[1], wanted)
        return 404, {"error_code": 404, "message": f"{method} /{'/'.join(parts)}: a path this double lacks"}

    def _version(self, subject: str, version: int) -> dict:
        schema_id = self._subjects[subject][version - 1]
        text = next(t for t, i in self._ids.items() if i == schema_id)
        return {"subject": subject, "version": version, "id": schema_id, "schema": text}

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, status: int, answer: object) -> None:
        payload = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)
