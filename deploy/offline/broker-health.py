#!/usr/bin/env python3
"""Health check of the stand-in broker: a Kafka ApiVersions (v0) request, standard library only.

    broker-health HOST:PORT      exit 0 if the broker answers with error code 0, else 1
"""

import socket
import struct
import sys


def api_versions_ok(host: str, port: int, timeout: float = 4.0) -> bool:
    client = b"ctiflow-health"
    # request header v1: api_key 18 (ApiVersions), version 0, correlation id 7, client id
    body = struct.pack(">hhih", 18, 0, 7, len(client)) + client
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(struct.pack(">i", len(body)) + body)
        head = b""
        while len(head) < 4:
            chunk = conn.recv(4 - len(head))
            if not chunk:
                return False
            head += chunk
        (size,) = struct.unpack(">i", head)
        reply = b""
        while len(reply) < min(size, 6):
            chunk = conn.recv(size - len(reply))
            if not chunk:
                return False
            reply += chunk
    correlation, error = struct.unpack(">ih", reply[:6])
    return correlation == 7 and error == 0


if __name__ == "__main__":
    host, _, port = (sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9094").rpartition(":")
    try:
        ok = api_versions_ok(host or "127.0.0.1", int(port))
    except OSError as exc:
        print(f"broker-health: {exc}", file=sys.stderr)
        ok = False
    sys.exit(0 if ok else 1)
