#!/usr/bin/env python3
"""Loopback forwarder for a broker that advertises a single address (the offline stand-in).

tansu advertises one listener, ``localhost:9094`` (published on the host's 127.0.0.1:9094), so a
client inside another container that bootstraps from ``kafka:9094`` is told to connect to its
*own* ``localhost:9094``. This forwards that loopback port to the broker container:

    broker-forward.py kafka:9094        listen on 127.0.0.1:9094, forward to kafka:9094

The ctiflow entry point starts it in the background when ``CTIFLOW_BROKER_FORWARD`` is set
(docker-compose.offline.yml sets it); the official Kafka image has a listener per network and
needs none. Standard library only; each connection is two copy loops.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(listen_port: int, host: str, port: int) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            broker_r, broker_w = await asyncio.open_connection(host, port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, broker_w), _pipe(broker_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    target = sys.argv[1]
    host, _, port = target.rpartition(":")
    asyncio.run(serve(int(port), host, int(port)))
