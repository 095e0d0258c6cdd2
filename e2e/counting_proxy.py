"""A counting HTTP pass-through, put between Larder and the real S3 server in tests.

It forwards every request unchanged (including the Host header, so SigV4 signatures stay valid)
and records what arrived, so tests count upstream requests where they land rather than trusting
Larder's own counters.
"""

import http.client
import http.server
import threading
import time
import socketserver

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}


class CountingProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str | None]] = []
        # Seconds to wait before forwarding each request: upstream latency, as tests set it.
        self.delay = 0.0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    proxy.requests.append((self.command, self.path, self.headers.get("Range")))
                if proxy.delay:
                    time.sleep(proxy.delay)
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                self.send_response_only(resp.status, resp.reason)
                chunked = resp.getheader("Content-Length") is None and self.command != "HEAD" and resp.status not in (204, 304)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if self.command != "HEAD":
                    while True:
                        chunk = resp.read(256 * 1024)
                        if not chunk:
                            break
                        if chunked:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        else:
                            self.wfile.write(chunk)
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reset(self):
        with self.lock:
            self.requests.clear()

    def seen(self, method: str | None = None, path_prefix: str = "") -> list[tuple[str, str, str | None]]:
        with self.lock:
            return [r for r in self.requests if (method is None or r[0] == method) and r[1].startswith(path_prefix)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
