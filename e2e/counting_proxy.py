"""A counting, fault-injecting HTTP pass-through, put between Larder and the real S3 server in
tests.

It forwards every request unchanged (including the Host header, so SigV4 signatures stay valid)
and records what arrived, so tests count upstream requests where they land rather than trusting
Larder's own counters. Tests can also make it misbehave the way S3 and networks do: add latency,
answer 500 or 503 SlowDown, reset the connection before answering, or cut a body mid-stream.
"""

import http.client
import http.server
import random
import socket
import threading
import time
import socketserver

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}


class CountingProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str | None]] = []
        # The headers of each request in `requests`, same order (names lowercased).
        self.headers: list[dict[str, str]] = []
        # Seconds to wait before forwarding each request: upstream latency, as tests set it,
        # plus up to `jitter` more at random.
        self.delay = 0.0
        self.jitter = 0.0
        # Body bytes sent back to Larder, all requests together (measured, not derived from ranges).
        self.body_bytes = 0
        # Longest a `hang` or `stall` fault holds its connection open.
        self.hold = 30.0
        # Pending one-shot faults: [kind, remaining, argument, method or None].
        self.faults: list[list] = []
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
                    proxy.headers.append({k.lower(): v for k, v in self.headers.items()})
                    fault = proxy._take_fault(self.command)
                if proxy.delay or proxy.jitter:
                    time.sleep(proxy.delay + random.random() * proxy.jitter)
                if fault and fault[0] == "delay":
                    time.sleep(fault[1])
                if fault and fault[0] == "reset":
                    # Close without a word: the client sees a reset or an empty reply.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault and fault[0] == "status":
                    status, code = fault[1]
                    err = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                           f"<Message>injected by the test proxy</Message></Error>").encode()
                    self.send_response_only(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(err)
                    return
                if fault and fault[0] == "hang":
                    # Take the request and say nothing, holding the connection open: an upstream
                    # that stalls before its first byte without closing.
                    proxy._hold(self.connection)
                    return
                cut_after = fault[1] if fault and fault[0] == "cut" else None
                stall_after = fault[1] if fault and fault[0] == "stall" else None
                pause_at, pause_for = fault[1] if fault and fault[0] == "pause" else (None, 0)
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                if fault and fault[0] == "late":
                    # Answered upstream already; the answer is slow to come back.
                    time.sleep(fault[1])
                self.send_response_only(resp.status, resp.reason)
                chunked = resp.getheader("Content-Length") is None and self.command != "HEAD" and resp.status not in (204, 304)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def emit(data: bytes):
                    if not data:
                        return
                    if chunked:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    else:
                        self.wfile.write(data)

                if self.command != "HEAD":
                    sent = 0
                    while True:
                        chunk = resp.read(64 * 1024)
                        if not chunk:
                            break
                        limit = stall_after if stall_after is not None else cut_after
                        broken = limit is not None and sent + len(chunk) > limit
                        if broken:
                            chunk = chunk[: limit - sent]
                        with proxy.lock:
                            proxy.body_bytes += len(chunk)
                        if broken and stall_after is not None:
                            # Send what is allowed, then fall silent with the connection open.
                            emit(chunk)
                            self.wfile.flush()
                            conn.close()
                            proxy._hold(self.connection)
                            return
                        if broken:
                            # Send what is allowed, then drop the connection mid-body.
                            emit(chunk)
                            self.wfile.flush()
                            self.close_connection = True
                            self.connection.shutdown(socket.SHUT_RDWR)
                            conn.close()
                            return
                        if pause_at is not None and sent + len(chunk) > pause_at:
                            # Send what comes before the pause, fall silent, then go on.
                            emit(chunk[: pause_at - sent])
                            self.wfile.flush()
                            time.sleep(pause_for)
                            chunk, sent, pause_at = chunk[pause_at - sent:], pause_at, None
                        sent += len(chunk)
                        emit(chunk)
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request, client_address):
                pass  # injected resets and cuts break pipes on purpose

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _hold(self, connection):
        """Keep `connection` open and silent until the other side closes it or `hold` seconds
        pass (bounded, so no thread outlives its test by much), then close it."""
        connection.settimeout(self.hold)
        try:
            while connection.recv(65536):
                pass
        except OSError:
            pass
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def reset(self):
        with self.lock:
            self.requests.clear()
            self.headers.clear()
            self.body_bytes = 0
            self.faults.clear()
        self.delay = self.jitter = 0.0

    def inject(self, kind: str, times: int, arg=None, method: str | None = "GET"):
        """Misbehave on the next `times` requests of `method` (None: any): `status` answers
        arg=(status, code); `reset` closes the connection unanswered; `cut` drops the connection
        after arg body bytes; `delay` waits arg seconds first; `late` forwards at once and waits
        arg seconds before passing the answer back (it says what the server held when asked);
        `hang` never answers and keeps the connection open; `stall` sends the headers and arg
        body bytes, then nothing more, keeping the connection open; `pause` (arg=(bytes,
        seconds)) sends the headers and that many body bytes, falls silent for that long, then
        sends the rest."""
        with self.lock:
            self.faults.append([kind, times, arg, method])

    def _take_fault(self, method: str):
        for fault in self.faults:
            kind, remaining, arg, only = fault
            if remaining > 0 and (only is None or only == method):
                fault[1] -= 1
                return (kind, arg)
        return None

    def seen(self, method: str | None = None, path_prefix: str = "") -> list[tuple[str, str, str | None]]:
        with self.lock:
            return [r for r in self.requests if (method is None or r[0] == method) and r[1].startswith(path_prefix)]

    def seen_with_headers(self, method: str | None = None, path_prefix: str = "") -> list[tuple[str, str, dict]]:
        """(method, path, headers) of each request that arrived, filtered like `seen`."""
        with self.lock:
            return [(r[0], r[1], h) for r, h in zip(self.requests, self.headers)
                    if (method is None or r[0] == method) and r[1].startswith(path_prefix)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
