#!/usr/bin/env python3
"""moto's S3 server answering one request at a time, so its check-then-write
conditional PUTs (If-Match / If-None-Match) are atomic under concurrent
writers. Needs `pip install 'moto[server]'`.

Usage: moto_serial.py HOST PORT
"""
import sys

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

if __name__ == "__main__":
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(sys.argv[1], int(sys.argv[2]), app, threaded=False, use_reloader=False)
