"""The dashboard's server: Bokeh's Tornado app serving ``app.build_document`` at ``/``, over one shared ``Store``.

``DashboardServer`` binds its socket first (so port 0 yields the real port before anything is announced), lists the
websocket origins explicitly (``host:port``, plus ``localhost:port`` on 127.0.0.1) and adds no file routes: the only
files served are Bokeh's own static ones. Any request whose path tries to climb (``..``, encoded or not) or names an
absolute path (``//``) gets a 404 before Bokeh's static handler could answer 403 for it.

Two ways to run it:
    serve(...)             blocking, on the main thread; SIGINT and SIGTERM stop it cleanly (``flowlab serve``)
    ServerThread(...)      in its own thread with its own event loop, so it keeps answering while a notebook cell
                           or a training loop blocks the caller (``flowlab.dashboard.show``, ``flowlab demo``)
"""
from __future__ import annotations

import asyncio
import ipaddress
import signal
import threading
from functools import partial
from urllib.parse import unquote

from bokeh.application import Application
from bokeh.application.handlers import FunctionHandler
from bokeh.server.server import BaseServer
from bokeh.server.tornado import BokehTornado
from bokeh.server.util import bind_sockets
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.routing import Matcher
from tornado.web import HTTPError, RequestHandler

from .app import build_document
from .store import Store

LOOPBACK = "127.0.0.1"


class _Climbing(Matcher):
    """Matches paths that step outside their folder once decoded: ``..`` segments, ``//`` or backslashes."""

    def match(self, request):
        path = unquote(unquote(request.path)).replace("\\", "/")
        return {} if ".." in path.split("/") or "//" in path else None


class _NotFound(RequestHandler):
    def prepare(self):
        raise HTTPError(404)


def _host_port(host, port):
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


class DashboardServer:
    """The dashboard on ``host:port`` (port 0: a free one); create it on the event loop thread that will run it."""

    def __init__(self, logdir, port=6006, host=LOOPBACK, reload_interval=1.0):
        self.store = Store(logdir, reload_interval)
        sockets, self.port = bind_sockets(host, port)
        self.host = host
        origins = [_host_port(host, self.port)] + ([f"localhost:{self.port}"] if host == LOOPBACK else [])
        app = Application(FunctionHandler(partial(build_document, store=self.store)))
        tornado_app = BokehTornado({"/": app}, extra_websocket_origins=origins)
        tornado_app.add_handlers(r".*", [(_Climbing(), _NotFound)])      # checked before Bokeh's own routes
        http = HTTPServer(tornado_app)
        http.add_sockets(sockets)
        self._server = BaseServer(IOLoop.current(), tornado_app, http)
        self.origins = origins

    @property
    def url(self):
        shown = LOOPBACK if self.host in ("", "0.0.0.0") else "::1" if self.host == "::" else self.host
        return f"http://{_host_port(shown, self.port)}/"

    def start(self):
        self.store.start()
        self._server.start()
        return self

    def stop(self):
        self._server.stop()
        self.store.stop()


def exposure_warning(host):
    """The warning to print when serving beyond this machine, or None on a loopback address."""
    if host in ("localhost", LOOPBACK, "::1"):
        return None
    return (f"warning: serving on {host}: anyone who can reach this machine can read these logs "
            f"(there is no authentication); use --host 127.0.0.1 to keep them local")


def serve(logdir, port=6006, host=LOOPBACK, reload_interval=1.0, out=print):
    """Run the dashboard until SIGINT or SIGTERM; raises OSError when the address cannot be bound."""

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):     # before the URL is out: a quick Ctrl-C still stops cleanly
            loop.add_signal_handler(sig, stop.set)
        server = DashboardServer(logdir, port, host, reload_interval).start()
        warning = exposure_warning(host)
        if warning:
            out(warning)
        out(f"flowlab dashboard for {server.store.logdir} at {server.url}  (Ctrl-C to stop)")
        await stop.wait()
        server.stop()
        out("flowlab dashboard stopped")

    asyncio.run(main())


class ServerThread:
    """The dashboard served from a daemon thread running its own event loop; ``.url``, ``.stop()``."""

    def __init__(self, logdir, port=0, host=LOOPBACK, reload_interval=1.0):
        self._args = (logdir, port, host, reload_interval)
        self._ready = threading.Event()
        self._error = None
        self._loop = self._stop = self.server = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="flowlab-dashboard",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    async def _main(self):
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            self.server = DashboardServer(*self._args).start()
        except BaseException as e:        # reported on the caller's thread
            self._error = e
            return
        finally:
            self._ready.set()
        await self._stop.wait()
        self.server.stop()

    @property
    def url(self):
        return self.server.url

    def stop(self):
        """Stop serving and wait for the thread to end (idempotent)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=10)

    def __repr__(self):
        return f"<flowlab dashboard at {self.url}>" if self.server else "<flowlab dashboard (not running)>"
