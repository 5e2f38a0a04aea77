"""The public addresses SkyPilot's managed-jobs monitor probes (HTTPS HEAD to 8.8.8.8
and 1.1.1.1) answered on this host, for the offline managed-jobs test
(tests/skypilot/sky_slurm_setup.sh with RLCTL_SKY_MANAGED=1, which puts both addresses
on the loopback device). ``probe_server.py CERT KEY``: 200 to every HEAD and GET."""

from __future__ import annotations

import http.server
import ssl
import sys
import threading

ADDRESSES = ("8.8.8.8", "1.1.1.1")


class Answer(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args: object) -> None:  # a probe every few seconds: quiet
        pass


def main(cert: str, key: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for address in ADDRESSES:
        server = http.server.ThreadingHTTPServer((address, 443), Answer)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"answering HTTPS on {', '.join(ADDRESSES)}:443", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:3])
