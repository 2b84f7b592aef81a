#!/usr/bin/env python3
"""An HTTP fault proxy between ckpt's S3 client and moto, for wire-level tests.

    fault_proxy.py UPSTREAM_URL

Prints "HOST:PORT" once it listens, then reads rules on stdin, one a line,
answering each with "ok":
  fault KIND COUNT [METHOD]   the next COUNT requests (of METHOD, if given) get KIND:
      reset      the response's headers and half its body, then a TCP reset
      stall      the response's headers and half its body, then silence for 5 s
      truncate   the response's headers (full Content-Length) and half its body, then close
      503        503 SlowDown, not forwarded
      error200   200 with an <Error> body (as S3 may answer CompleteMultipartUpload), not forwarded
  count                        answers the number of requests proxied so far
Every other request is forwarded as is. Exits at end of input.
"""
import http.client
import http.server
import socket
import struct
import sys
import threading
import time
import urllib.parse

UPSTREAM = urllib.parse.urlparse(sys.argv[1])
RULES = []  # [kind, count, method]
LOCK = threading.Lock()
SEEN = [0]

ERROR_503 = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
             b"<Message>Please reduce your request rate.</Message><RequestId>proxy</RequestId></Error>")
ERROR_200 = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code>"
             b"<Message>We encountered an internal error.</Message><RequestId>proxy</RequestId></Error>")


def take_rule(method):
    with LOCK:
        SEEN[0] += 1
        for rule in RULES:
            if rule[1] > 0 and (rule[2] is None or rule[2] == method):
                rule[1] -= 1
                return rule[0]
    return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        kind = take_rule(self.command)
        if kind in ("503", "error200"):
            payload = ERROR_503 if kind == "503" else ERROR_200
            self.send_response(503 if kind == "503" else 200)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(UPSTREAM.hostname, UPSTREAM.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        headers["Host"] = self.headers.get("Host", "")
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if kind is None or self.command == "HEAD":
            self.wfile.write(data)
            return
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        if kind == "stall":
            time.sleep(5)
        if kind == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR) if kind != "reset" else None
        except OSError:
            pass

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address
    print(f"{host}:{port}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if len(words) in (3, 4) and words[0] == "fault":
            with LOCK:
                RULES.append([words[1], int(words[2]), words[3] if len(words) == 4 else None])
            print("ok", flush=True)
        elif words == ["count"]:
            with LOCK:
                print(SEEN[0], flush=True)
        else:
            print(f"error: unknown command {line.strip()!r}", flush=True)
    server.shutdown()


if __name__ == "__main__":
    main()
