"""A TCP proxy that holds every chunk it forwards for a while, each way: a
stand-in for a database far from its workers, where tc netem is not at
hand. Used for the "distant database" row of bench/HISTORY.md (session 11):

    python3 bench/delay_proxy.py 6543 5432 0.5 &
    jobdeck bench --db postgres://postgres@127.0.0.1:6543/test --jobs 4000 --cycles-in-flight 2

The delay is asyncio's timer, so the added latency is coarser than asked
(0.5 ms each way gave a 2.6 ms SELECT 1 round trip), and the proxy costs
CPU per packet on the same machine.
"""

import asyncio
import socket
import sys


async def pipe(reader, writer, delay):
    loop = asyncio.get_running_loop()
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            loop.call_later(delay, writer.write, data)
    finally:
        await asyncio.sleep(delay * 2)
        writer.close()


async def serve(listen_port, target_port, delay):
    async def handle(client_r, client_w):
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        for w in (client_w, server_w):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pipe(client_r, server_w, delay), pipe(server_r, client_w, delay))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: delay_proxy.py LISTEN_PORT TARGET_PORT DELAY_MS")
    try:
        listen_port, target_port, delay_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    except ValueError:
        sys.exit("delay_proxy.py: ports are integers, DELAY_MS a number")
    asyncio.run(serve(listen_port, target_port, delay_ms / 1000))


if __name__ == "__main__":
    main()
