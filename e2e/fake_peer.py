"""An impostor fleet member for attack tests: it speaks Larder's peer protocol (HTTP/2 without
TLS, prior knowledge) on loopback but does not hold the fleet's secret, so it answers every
request with plausible, unsigned answers: an `/v1/info` naming the right block size, forged
block bytes, and a forged 404 for `/v1/open`. A replica that trusted it would serve its bytes."""

import json
import socket
import threading

import h2.config
import h2.connection
import h2.events


class FakePeer:
    def __init__(self, host: str, port: int, block_size: int, forged: bytes = b"\x66"):
        self.block_size = block_size
        self.forged = forged
        self.requests: list[str] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.sock.settimeout(0.5)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _answer(self, path: str) -> tuple[int, bytes]:
        if path.startswith("/v1/info"):
            return 200, json.dumps({"id": 4242, "zone": None, "block_size": self.block_size}).encode()
        if path.startswith("/v1/block"):
            return 200, self.forged * self.block_size
        return 404, json.dumps({"service": {"status": 404, "code": "NoSuchKey", "message": "forged"}}).encode()

    def _serve(self, conn: socket.socket):
        h2conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False))
        h2conn.initiate_connection()
        conn.sendall(h2conn.data_to_send())
        pending: dict[int, bytes] = {}
        conn.settimeout(30)
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                for event in h2conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        headers = dict((k.decode() if isinstance(k, bytes) else k,
                                        v.decode() if isinstance(v, bytes) else v) for k, v in event.headers)
                        path = headers.get(":path", "/")
                        self.requests.append(path)
                        status, body = self._answer(path)
                        h2conn.send_headers(event.stream_id, [(":status", str(status)),
                                                              ("content-length", str(len(body)))])
                        pending[event.stream_id] = body
                for stream_id in list(pending):
                    body = pending[stream_id]
                    while body:
                        room = min(h2conn.local_flow_control_window(stream_id), h2conn.max_outbound_frame_size)
                        if room <= 0:
                            break
                        h2conn.send_data(stream_id, body[:room])
                        body = body[room:]
                    if body:
                        pending[stream_id] = body
                    else:
                        h2conn.end_stream(stream_id)
                        del pending[stream_id]
                conn.sendall(h2conn.data_to_send())
        except Exception:  # noqa: BLE001 - a test double: the replica closing on it ends it
            return
        finally:
            conn.close()

    def close(self):
        self.closed = True
        self.sock.close()
