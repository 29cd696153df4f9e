#!/usr/bin/env python3
"""moto's S3 server answering one request at a time, so its check-then-write
conditional PUTs (If-Match / If-None-Match) are atomic under concurrent
writers. Needs `pip install 'moto[server]'`.

Usage: moto_serial.py HOST PORT

PORT 0 lets the system pick a port; the bound port is printed as the first
line of output.
"""
import sys

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

if __name__ == "__main__":
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server(sys.argv[1], int(sys.argv[2]), app, threaded=False)
    print(server.socket.getsockname()[1], flush=True)
    server.serve_forever()
