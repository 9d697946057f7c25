#!/usr/bin/env python3
"""A TCP proxy on loopback that holds what clients send for a while: a store far away.

    python bench/delay_proxy.py LISTEN_PORT TARGET_PORT DELAY_MS

Every chunk a client sends (an HTTP request, in practice) reaches 127.0.0.1:TARGET_PORT
DELAY_MS later; answers come back at once.  So each request to an S3 server behind it
costs DELAY_MS more, as with a store across a network, on a machine whose kernel has no
netem.  Loopback only; for benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while data := await reader.read(1 << 16):
            if delay:
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _serve(listen_port: int, target_port: int, delay: float) -> None:
    async def handle(client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        try:
            server_reader, server = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client.close()
            return
        await asyncio.gather(_pipe(client_reader, server, delay), _pipe(server_reader, client, 0.0))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


def main() -> int:
    listen_port, target_port, delay_ms = (int(argument) for argument in sys.argv[1:4])
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(listen_port, target_port, delay_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
