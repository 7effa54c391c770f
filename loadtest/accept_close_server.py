"""Raw accept-and-close baseline: accept every connection and close it at once.

Usage: python loadtest/accept_close_server.py [--port N]   (0 = ephemeral)
Runs until SIGTERM/SIGINT (exit 0) or a 600 s safety timeout.
"""
import argparse, os, signal, socket
import uvloop


def main(port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    sock.setblocking(False)
    accept = sock._accept                    # C-level accept: returns (fd, addr)

    def on_readable():
        while True:                          # drain the accept queue
            try:
                fd, _ = accept()
            except BlockingIOError:
                return
            except OSError:                  # e.g. ECONNABORTED, EMFILE: try later
                return
            os.close(fd)

    loop = uvloop.new_event_loop()
    loop.add_reader(sock.fileno(), on_readable)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, loop.stop)
    loop.call_later(600, loop.stop)
    print(f"listening 127.0.0.1:{sock.getsockname()[1]}", flush=True)
    loop.run_forever()
    loop.close()
    sock.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    main(ap.parse_args().port)
