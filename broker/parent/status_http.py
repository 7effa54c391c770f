"""The parent's HTTP endpoint on `prometheus.listen`: `/metrics` (the shared block's counters,
broker.parent.metrics) and `/connections` (who is connected now, broker.parent.connection_list),
on a thread of its own so a busy parent loop never delays a scrape.

    GET /metrics                               Prometheus exposition
    GET /connections?top=N&by=bytes|requests|throttle|age
                                               JSON: the top N connections across all workers
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import urllib.parse
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from broker.parent.connection_list import DEFAULT_TOP, ConnectionListing, ListingBusy

log = logging.getLogger("broker.parent.status_http")


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds the broker's shutdown


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        """Scrapes every few seconds would drown the log."""


def _json(start_response, status: str, body: dict) -> list[bytes]:
    data = json.dumps(body, indent=1).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data)))])
    return [data]


def _connections_app(listing: ConnectionListing):
    def app(environ, start_response):
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        try:
            top = int(query.get("top", [DEFAULT_TOP])[0])
            return _json(start_response, "200 OK",
                         listing.ask(top, query.get("by", ["bytes"])[0]))
        except ValueError as error:
            return _json(start_response, "400 Bad Request", {"error": str(error)})
        except ListingBusy as error:
            return _json(start_response, "503 Service Unavailable", {"error": str(error)})

    return app


def serve_status(host: str, port: int, collectors: list, listing: ConnectionListing):
    """Start the endpoint on a daemon thread; return (server, bound port)."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    metrics, connections = make_wsgi_app(registry), _connections_app(listing)

    def route(environ, start_response):
        if environ.get("PATH_INFO", "").rstrip("/") == "/connections":
            return connections(environ, start_response)
        return metrics(environ, start_response)  # /metrics, and / as prometheus-client does

    server_class = type("StatusServer", (_Server,), {
        "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    server = make_server(host, port, route, server_class, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="status-http", daemon=True).start()
    return server, server.server_port
