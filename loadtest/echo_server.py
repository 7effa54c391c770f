"""Minimal uvloop echo server for 4-byte big-endian length-prefixed frames.

Baseline for the broker benchmark: every complete frame is echoed back; all
complete frames from one data_received() go out in ONE transport.write().
Usage: python loadtest/echo_server.py [--port N]   (0 = ephemeral)
Runs until SIGTERM/SIGINT (exit 0) or a 600 s safety timeout.
"""
import argparse, asyncio, signal, struct
import uvloop

_size = struct.Struct(">i").unpack_from


class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.t, self.buf = transport, None   # buf holds only a trailing partial frame

    def data_received(self, data):
        if self.buf:
            self.buf += data
            data = self.buf
        pos, n = 0, len(data)
        while pos + 4 <= n:                  # find the end of the last complete frame
            size = _size(data, pos)[0]
            if size < 0:                     # garbage: drop the connection
                self.t.abort()
                return
            end = pos + 4 + size
            if end > n:
                break
            pos = end
        # Complete frames are contiguous, so data[:pos] == b''.join(frames): one write.
        if pos:
            self.t.write(data if pos == n else bytes(data[:pos]))
        self.buf = bytearray(data[pos:]) if pos < n else None


async def main(port):
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, "127.0.0.1", port, backlog=4096)
    print(f"listening 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    loop.call_later(600, lambda: stop.done() or stop.set_result(None))
    await stop
    server.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    uvloop.run(main(ap.parse_args().port))
