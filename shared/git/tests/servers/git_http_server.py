#!/usr/bin/env python3
"""Push-capable git smart-HTTP server for tests, around `git http-backend`
(standard library only).

Usage: git_http_server.py ROOT PORT

Serves ROOT/<name>.git on 127.0.0.1:PORT (PORT 0: a port the system picks)
and prints the bound port as its first line of output. Each repository needs
`http.receivepack true` to accept pushes. Test controls:
  * GIT_TEST_AUTH=user:password  requires that basic-auth pair (else 401);
  * ROOT/.fail-receive-pack holding N: the next N receive-pack POSTs answer
    HTTP 500 without touching the repository;
  * ROOT/.fail-upload-pack holding N: the same for upload-pack POSTs.
"""
import base64
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

ROOT, PORT = os.path.abspath(sys.argv[1]), int(sys.argv[2])
BACKEND = os.path.join(
    subprocess.check_output(["git", "--exec-path"], text=True).strip(), "git-http-backend"
)
AUTH = os.environ.get("GIT_TEST_AUTH")


def take_fault(name):
    path = os.path.join(ROOT, name)
    try:
        with open(path) as f:
            left = int(f.read().strip() or "0")
    except FileNotFoundError:
        return False
    if left <= 0:
        return False
    with open(path, "w") as f:
        f.write(str(left - 1))
    return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, status, payload, headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def handle_any(self):
        url = urlsplit(self.path)
        body = self.body()
        if AUTH:
            expected = "Basic " + base64.b64encode(AUTH.encode()).decode()
            if self.headers.get("Authorization") != expected:
                self.reply(401, b"auth required\n", [("WWW-Authenticate", 'Basic realm="git"')])
                return
        if self.command == "POST":
            for service in ("receive-pack", "upload-pack"):
                if url.path.endswith("/git-" + service) and take_fault(".fail-" + service):
                    self.reply(500, b"injected failure\n", [("Content-Type", "text/plain")])
                    return
        env = {
            "PATH": os.environ["PATH"],
            "GIT_PROJECT_ROOT": ROOT,
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": url.path,
            "QUERY_STRING": url.query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": "tester",
            "REMOTE_ADDR": self.client_address[0],
            "SERVER_PROTOCOL": "HTTP/1.1",
        }
        for header in ("Content-Encoding", "Git-Protocol"):
            if self.headers.get(header):
                env["HTTP_" + header.upper().replace("-", "_")] = self.headers[header]
        if env.get("HTTP_GIT_PROTOCOL"):
            env["GIT_PROTOCOL"] = env["HTTP_GIT_PROTOCOL"]
        done = subprocess.run([BACKEND], input=body, env=env, capture_output=True)
        head, sep, payload = done.stdout.partition(b"\r\n\r\n")
        if not sep:
            head, _, payload = done.stdout.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            key, _, value = line.partition(":")
            value = value.strip()
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers.append((key, value))
        self.reply(status, payload, headers)

    do_GET = handle_any
    do_POST = handle_any


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
