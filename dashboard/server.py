"""The dashboard's server: Bokeh's Tornado app serving ``app.build_document`` at ``/``, over one shared ``Store``.

``DashboardServer`` binds its socket first (so port 0 yields the real port before anything is announced) and adds
no file routes: the only files served are Bokeh's own static ones, and the one route it adds is the Scalars tab's
"all shown" download (``export/scalars/<one-time token>.<fmt>``, streamed from a worker thread: ``export_stream``).
Before any of Bokeh's routes, every request
(the websocket upgrade included) passes ``_refusal``:

* ``Host`` must name this server: 127.0.0.1, localhost or [::1] with the served port, or what ``--host`` names
  (on a wildcard bind, any IP literal too: a DNS-rebinding page always arrives under a *name*). Otherwise 403.
* ``Origin``, when sent, must be one of those same hosts over http, checked on its own: Tornado lets a websocket
  through when ``Origin`` equals ``Host`` or ``Sec-Fetch-Site`` says same-origin, which is exactly what a
  rebinding page sends. Otherwise 403.
* The path must decode to UTF-8 text without control characters (``%00`` made Tornado's static handler answer
  500); otherwise 400. A path that tries to climb (``..``, encoded or not) or names an absolute path (``//``) gets
  a 404 before Bokeh's static handler could answer 403 for it.

Session ids are signed with a key the server makes at each start (Bokeh's ``sign_sessions``): a page request with a
``bokeh-session-id`` or ``bokeh-token`` the server did not issue gets a plain 403, and a websocket whose token it did
not sign is closed (``_forged``, ``_WS.open``). Unsigned, Bokeh took a client's id as it came, so a client could make
a session of any id or join a live one whose id it knew.

Every response carries a Content-Security-Policy (inline scripts only with this response's nonce; ``unsafe-eval``
because BokehJS compiles ``CustomJS`` code with ``new Function``; framing only by loopback pages, as
``flowlab.dashboard.show`` embeds it in an IFrame of a local Jupyter page), ``X-Frame-Options``,
``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``. No traceback is ever sent, and none is
logged for anything a client can send: Bokeh's ``/autoload.js`` preflight and websocket handler are replaced by
guarded subclasses (``_AutoloadJs``, ``_WS``; see them for the Bokeh 3.9 bugs they avoid). The logdir is printed
with its URL credentials redacted (``flowlab.summary.redact``).

Two ways to run it:
    serve(...)             blocking, on the main thread; SIGINT and SIGTERM stop it within a second (``flowlab serve``)
    ServerThread(...)      in its own thread with its own event loop, so it keeps answering while a notebook cell
                           or a training loop blocks the caller (``flowlab.dashboard.show``)
    ServerProcess(...)     in a child process, so a page's work never competes with the caller's threads for the
                           interpreter: ``flowlab demo`` trains at full speed with a page open
"""
from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import os
import pickle
import re
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from urllib.parse import unquote, unquote_to_bytes, urlsplit

from bokeh.application import Application
from bokeh.application.handlers import FunctionHandler
from bokeh.protocol.exceptions import ProtocolError
from bokeh.server.server import BaseServer
from bokeh.server.tornado import BokehTornado
from bokeh.server.util import bind_sockets
from bokeh.server.views.autoload_js_handler import AutoloadJsHandler
from bokeh.server.views.doc_handler import DocHandler
from bokeh.server.views.ws import WSHandler
from bokeh.util.token import check_session_id_signature, check_token_signature
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.routing import Matcher
from tornado.web import OutputTransform, RequestHandler

from flowlab.summary.redact import redact

from .app import build_document
from .export_stream import ROUTE as EXPORT_ROUTE, ExportHandler
from .store import RELOAD_INTERVAL, Store
from .views.projector import WORKERS

LOOPBACK = "127.0.0.1"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
_WILDCARDS = ("", "0.0.0.0", "::")
_SCRIPT_TAG = re.compile(rb"<script\b", re.IGNORECASE)
KEEP_ALIVE_MS = 37_000          # Bokeh's websocket ping period (its default); tests shorten it to race closes


def _ip(name):
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _host_port(host, port):
    ip = _ip(host)
    return f"[{host}]:{port}" if ip is not None and ip.version == 6 else f"{host}:{port}"


def _split_host(value, default_port):
    """``(name, port)`` of a ``Host`` header or an origin's netloc (lower case, IPv6 without brackets), or None
    when it is malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    else:
        name, _, port = value.partition(":")
    if not name:
        return None
    if not port:
        return name, default_port
    return (name, int(port)) if port.isascii() and port.isdigit() and len(port) <= 5 else None


class Allowlist:
    """Which ``Host`` headers and ``Origin`` values a server bound to ``host:port`` answers to.

    Names, always with the served port: ``host`` itself, localhost, and the loopback address of each family the
    socket listens on (127.0.0.1 for IPv4, ::1 for IPv6; both for a name or a wildcard). A wildcard bind (0.0.0.0,
    ::) adds every IP literal: the rebinding attack needs a name of the attacker's that resolves here, while a page
    reached by IP address is that address's own origin."""

    def __init__(self, host, port):
        self.port = port
        self.any_ip = host in _WILDCARDS
        ip = _ip(host)
        loopback = ["127.0.0.1", "::1"] if ip is None else ["127.0.0.1" if ip.version == 4 else "::1"]
        names = ([] if self.any_ip else [host.lower()]) + ["localhost"] + loopback
        self.names = list(dict.fromkeys(names))           # ordered: the bound host first

    def _allows(self, name, port):
        return port == self.port and (name in self.names or (self.any_ip and _ip(name) is not None))

    def host_ok(self, value):
        parts = _split_host(value or "", 80)            # a browser leaves out the port only when it is 80
        return parts is not None and self._allows(*parts)

    def origin_ok(self, origin):
        url = urlsplit(origin or "")
        if url.scheme != "http" or url.path not in ("", "/"):
            return False                                # "null", file:, https: (this server speaks plain http)
        parts = _split_host(url.netloc, 80)
        return parts is not None and self._allows(*parts)

    @property
    def shown(self):
        """The allowed hosts as ``host:port`` strings, for messages and for Bokeh's own websocket allowlist."""
        shown = [_host_port(n, self.port) for n in self.names]
        return shown + ([f"<any IP address>:{self.port}"] if self.any_ip else [])

    def frame_ancestors(self, extra=()):
        """CSP ``frame-ancestors``: this server's own pages and any page served from an allowed host name (on any
        port: Jupyter runs on its own), plus ``extra`` sources (e.g. ``vscode-webview:``)."""
        names = [f"{n}:*" for n in self.names if ":" not in n]         # CSP has no syntax for IPv6 literals
        return " ".join(["'self'"] + [f"http://{n}" for n in names] + list(extra))


def _refusal(request, allow):
    """``(status, message)`` for a request this server must not answer, or None."""
    host = request.headers.get("Host", "")
    if not allow.host_ok(host):
        return 403, (f"Host header {host!r} is not one this dashboard answers to (expected one of "
                     f"{', '.join(allow.shown)}); a foreign name resolving here is how DNS rebinding works")
    origin = request.headers.get("Origin")
    if origin is not None and not allow.origin_ok(origin):
        return 403, (f"Origin {origin!r} may not use this dashboard (expected http:// with one of "
                     f"{', '.join(allow.shown)})")
    raw = unquote_to_bytes(request.path)
    try:
        path = raw.decode("utf-8")
    except UnicodeDecodeError:
        return 400, f"the path {raw!r} is not UTF-8 text once decoded"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return 400, f"the path {path!r} holds a control character"
    path = unquote(path).replace("\\", "/")            # decoded twice: %252e%252e is .. to a second decoder
    if ".." in path.split("/") or "//" in path:
        return 404, "Not Found"
    return None


class _Refused(Matcher):
    """Matches the requests ``_refusal`` objects to; routed before any of Bokeh's handlers."""

    def __init__(self, allow):
        self.allow = allow

    def match(self, request):
        verdict = _refusal(request, self.allow)
        return None if verdict is None else {"target_kwargs": {"status": verdict[0], "message": verdict[1]}}


class _Refuse(RequestHandler):
    """Answers the status and plain-text message ``_Refused`` found (never HTML, never a traceback)."""

    def initialize(self, status, message):
        self.status, self.message = status, message

    def prepare(self):
        self.set_status(self.status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(self.message + "\n")


class _SecurityHeaders(OutputTransform):
    """Adds the security headers to every response of the application; in an HTML page, gives each ``<script>``
    this response's CSP nonce (Bokeh's pages bootstrap with inline scripts; no log text is in them: the document
    comes over the websocket)."""

    def __init__(self, request, frame_ancestors):
        super().__init__(request)
        self.frame_ancestors = frame_ancestors

    def transform_first_chunk(self, status_code, headers, chunk, finishing):
        script_src = "'self' 'unsafe-eval'"            # BokehJS runs CustomJS code through new Function
        if headers.get("Content-Type", "").startswith("text/html") and finishing and _SCRIPT_TAG.search(chunk):
            nonce = secrets.token_urlsafe(18)
            chunk = _SCRIPT_TAG.sub(f'<script nonce="{nonce}"'.encode(), chunk)
            script_src += f" 'nonce-{nonce}'"
            headers["Content-Length"] = str(len(chunk))
            headers["Cache-Control"] = "no-store"       # a cached copy would hold a nonce the new header lacks
            headers.pop("Etag", None)
        headers["Content-Security-Policy"] = "; ".join([
            "default-src 'none'", f"script-src {script_src}", "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data: blob:", "font-src 'self' data:", "connect-src 'self'",
            f"frame-ancestors {self.frame_ancestors}", "base-uri 'none'", "form-action 'none'",
            "object-src 'none'"])
        headers["X-Frame-Options"] = "SAMEORIGIN"       # for browsers without frame-ancestors (which overrides it)
        headers["X-Content-Type-Options"] = "nosniff"
        headers["Referrer-Policy"] = "no-referrer"
        headers["Cross-Origin-Resource-Policy"] = "same-origin"
        return status_code, headers, chunk


class _ClosedSends(logging.Filter):
    """Drops Bokeh's "Failed sending message as connection was closed" once a server of this process stops: a push
    already in flight when ``close_connections`` closes its socket is expected to fail, and Ctrl-C should print
    nothing but the goodbye line."""

    stopping = False

    def filter(self, record):
        return not (self.stopping and "connection was closed" in record.getMessage())


_closed_sends = _ClosedSends()
logging.getLogger("bokeh.server.views.ws").addFilter(_closed_sends)


_log = logging.getLogger(__name__)
OPEN_WAIT_S = 10.0              # how long a message that came before its websocket was set up waits for it


def _forged(handler):
    """Why a page request's ``bokeh-token`` or session id (argument or ``Bokeh-Session-Id`` header) was not made by
    this server, or None when it was (or none was sent: the server makes one). Bokeh reads a token before it checks
    its signature, so a malformed one was a 500 with a traceback; an unsigned session id was taken as it came."""
    app = handler.application
    token = handler.get_argument("bokeh-token", default=None)
    if token is not None and not check_token_signature(token, secret_key=app.secret_key, signed=app.sign_sessions):
        return "bokeh-token was not issued by this server"
    session_id = handler.get_argument("bokeh-session-id", default=None) or \
        handler.request.headers.get("Bokeh-Session-Id")
    if session_id is not None and not check_session_id_signature(session_id, secret_key=app.secret_key,
                                                                 signed=app.sign_sessions):
        return "bokeh-session-id was not issued by this server"
    return None


class _SessionIdsChecked:
    """Refuses (403, plain text, nothing logged beyond the status line) a page request whose token or session id
    this server did not sign (``_forged``), before Bokeh's handler reads it."""

    def prepare(self):
        why = _forged(self)
        if why is not None:
            self.set_status(403)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(why + "\n")
            return None
        return super().prepare()


class _Doc(_SessionIdsChecked, DocHandler):
    """Bokeh's page handler, session ids checked first (``_SessionIdsChecked``)."""


class _AutoloadJs(_SessionIdsChecked, AutoloadJsHandler):
    """Bokeh's ``/autoload.js`` whose CORS preflight answers a request without ``Origin`` (Bokeh 3.9 reads the
    header unconditionally: ``KeyError``, a 500 and a traceback in the log). Without an origin there is nothing
    to allow: 204 with the allowed methods, no ``Access-Control-Allow-Origin``."""

    async def options(self, *args, **kwargs):
        if "Origin" not in self.request.headers:
            self.set_header("Allow", "GET, OPTIONS")
            self.set_status(204)
            return
        await super().options(*args, **kwargs)


class _WS(WSHandler):
    """Bokeh's websocket handler, guarded against two orders of events Bokeh 3.9 does not expect:

    * a message before the connection is set up: Bokeh's ``open`` finishes in a later callback, and a message that
      comes first meets no receiver (``AttributeError``, logged with a traceback). It waits for the set-up (at most
      ``OPEN_WAIT_S``; a socket closed meanwhile drops it);
    * ``on_close`` after the keep-alive ping already reported the client lost: the ping finds the socket closing
      (the server closed it and waits for the client's answer, or the close frame came in the same loop iteration),
      and ``client_lost`` detaches the session that Bokeh's ``on_close`` then reads (``AssertionError`` in
      ``ServerConnection.session``). The loss is reported once, by whichever comes first (``_Bokeh.client_lost``).
    """

    closed_here = False

    def open(self):
        """Bokeh's ``open``, except that a connection without the ``bokeh`` subprotocol or without a token this server
        signed (forged, malformed, expired) is closed with a warning: Bokeh raised, and Tornado logged a traceback
        (a malformed token failed even inside Bokeh's own error message)."""
        app, token = self.application, self._token
        if self.selected_subprotocol != "bokeh" or token is None or \
                not check_token_signature(token, secret_key=app.secret_key, signed=app.sign_sessions):
            _log.warning("websocket from %s refused: no session token this server issued", self.request.remote_ip)
            self.close(1008, "no session token issued by this server")
            return
        try:
            super().open()
        except ProtocolError as e:               # an expired token: Bokeh closed the socket already
            _log.warning("websocket from %s refused: %s", self.request.remote_ip, e)

    async def on_message(self, fragment):
        deadline = time.monotonic() + OPEN_WAIT_S
        while self.receiver is None:
            if self.ws_connection is None or self.ws_connection.is_closing():
                return                          # closed before it was set up: nothing to answer
            if time.monotonic() > deadline:
                _log.warning("websocket from %s sent a message but was not set up within %s s; closing it",
                             self.request.remote_ip, OPEN_WAIT_S)
                self.close(1011, "connection not set up")
                return
            await asyncio.sleep(0.01)
        await super().on_message(fragment)

    def on_close(self):
        if self.connection is not None and self.connection not in self.application.live:
            _log.debug("websocket closed after its connection was reported lost: code=%s", self.close_code)
            return
        self.closed_here = True                 # Bokeh's on_close tells the session; client_lost need not
        super().on_close()


_GUARDED = {WSHandler: _WS, AutoloadJsHandler: _AutoloadJs, DocHandler: _Doc}


class _Bokeh(BokehTornado):
    """``BokehTornado`` that keeps each websocket beside its connection, so a stop can end them cleanly (Bokeh's
    own ``stop`` leaves them open, and sessions then push into closing sockets: one warning per message), and whose
    websocket and ``/autoload.js`` routes use the guarded handlers above."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.live = {}
        for rule in self.wildcard_router.rules:             # Bokeh's own routes, same paths and arguments
            rule.target = _GUARDED.get(rule.target, rule.target)

    def new_connection(self, protocol, socket, application_context, session):
        connection = super().new_connection(protocol, socket, application_context, session)
        self.live[connection] = socket
        return connection

    def client_lost(self, connection):
        socket = self.live.pop(connection, None)
        if socket is None:
            return                              # reported already (keep-alive, then on_close; or a stop)
        if not socket.closed_here:              # the keep-alive found it closed first: tell the document now
            connection.session.notify_connection_lost()
        super().client_lost(connection)

    def resources(self, absolute_url=None):
        """Bokeh's bundles without MathJax (1.8 MB of script parsed by every page) and WebGL: the dashboard draws on
        canvas and shows text from logs as plain text, never TeX."""
        resources = super().resources(absolute_url)
        resources.components = ["bokeh", "bokeh-widgets", "bokeh-tables"]
        return resources

    def close_connections(self):
        _closed_sends.stopping = True
        for connection, socket in list(self.live.items()):
            connection.session.unsubscribe(connection)    # first, so the session sends nothing more to it
            socket.close(1001, "flowlab dashboard stopped")     # its on_close then reports it lost


class DashboardServer:
    """The dashboard on ``host:port`` (port 0: a free one); create it on the event loop thread that will run it.

    ``frame_ancestors``: further CSP sources allowed to frame the dashboard besides loopback pages (for example
    ``"vscode-webview:"``). From ``start()`` to ``stop()`` it holds the projector's reduction workers
    (``views.projector.WORKERS``), which end with the last server that held them."""

    def __init__(self, logdir, port=6006, host=LOOPBACK, reload_interval=RELOAD_INTERVAL, frame_ancestors=(),
                 samples=None):
        self.store = Store(logdir, reload_interval, samples=samples)
        sockets, self.port = bind_sockets(host, port)
        self.host = host
        self.allow = Allowlist(host, self.port)
        # Bokeh's own websocket check stays as a second line: the same names, never a pattern
        origins = [_host_port(n, self.port) for n in self.allow.names]
        app = Application(FunctionHandler(partial(build_document, store=self.store)))
        # Session ids (and the tokens that carry them) are signed with a key of this server's own, made afresh at each
        # start: unsigned, any client could name the session it gets, another client's included (its page and its
        # websocket both took a client's id as it came, and a forged token joined a live session).
        self._tornado = _Bokeh({"/": app}, extra_websocket_origins=origins, serve_traceback=False,
                               keep_alive_milliseconds=KEEP_ALIVE_MS, sign_sessions=True,
                               secret_key=secrets.token_bytes(32), generate_session_ids=True)
        self._tornado.add_handlers(r".*", [(_Refused(self.allow), _Refuse),      # checked before Bokeh's routes
                                           (EXPORT_ROUTE, ExportHandler, {"store": self.store})])
        ancestors = self.allow.frame_ancestors(frame_ancestors)
        self._tornado.add_transform(partial(_SecurityHeaders, frame_ancestors=ancestors))
        self._http = HTTPServer(self._tornado)
        self._http.add_sockets(sockets)
        self._server = BaseServer(IOLoop.current(), self._tornado, self._http)
        self.origins = origins
        self._holds_workers = False

    @property
    def url(self):
        shown = LOOPBACK if self.host in ("", "0.0.0.0") else "::1" if self.host == "::" else self.host
        return f"http://{_host_port(shown, self.port)}/"

    def start(self):
        self.store.start()
        self._server.start()
        WORKERS.hold()                  # the projector's reduction workers live while some server runs
        self._holds_workers = True
        return self

    async def close(self, grace=0.3):
        """Stop listening, end every websocket and HTTP connection (waiting up to ``grace`` seconds for the
        closing handshakes), then stop Bokeh and the store."""
        self._http.stop()
        self._tornado.close_connections()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self._tornado.live and loop.time() < deadline:
            await asyncio.sleep(0.01)
        try:
            await asyncio.wait_for(self._http.close_all_connections(), max(deadline - loop.time(), 0.01))
        except asyncio.TimeoutError:
            pass                                        # a browser's idle keep-alive socket: dropped with the loop
        self.stop()

    def stop(self):
        self._server.stop()
        self.store.stop()
        if self._holds_workers:         # (stop() may come twice: close() stops too)
            self._holds_workers = False
            WORKERS.release()


def exposure_warning(host):
    """The warning to print when serving beyond this machine, or None on a loopback address."""
    if host in ("localhost", LOOPBACK, "::1"):
        return None
    return (f"warning: serving on {host}: anyone who can reach this machine can read these logs "
            f"(there is no authentication); use --host 127.0.0.1 to keep them local")


def settle_collector():
    """Move every object the process holds now out of the garbage collector's reach (``gc.freeze``, after a
    collection): at ``serve``'s start, once the store's first poll has read the logdir and before a page has come.
    Those objects live as long as the server (the store's series: ~200,000 objects at 100,000 runs), and every full
    collection walked them all, on whichever thread allocated: a loop stall of 100-180 ms each (a session's close
    makes one: Bokeh's ``Document.destroy`` calls ``gc.collect``). Frozen objects are still freed by reference
    counting; only cycles among them would outlive their use, and a store's series form none. Not for a server in a
    notebook's kernel (``ServerThread``): the user's objects are not the dashboard's to freeze."""
    gc.collect()
    gc.freeze()


def serve(logdir, port=6006, host=LOOPBACK, reload_interval=RELOAD_INTERVAL, out=print, grace=0.5, samples=None):
    """Run the dashboard until SIGINT or SIGTERM (call from the main thread); raises OSError when the address
    cannot be bound.

    The server runs in a ``ServerThread``; this thread only waits for the signal, so a page build that holds the
    server's event loop cannot delay it. On the signal the server gets ``grace`` seconds to close its connections;
    returns True when it did, False when its loop was still busy (the thread is a daemon: the process can exit)."""
    stop = threading.Event()
    # installed before the URL is out, so a quick Ctrl-C still stops cleanly
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = ServerThread(logdir, port, host, reload_interval, samples=samples)
        settle_collector()
        warning = exposure_warning(host)
        if warning:
            out(warning)
        out(f"flowlab dashboard for {redact(server.server.store.logdir)} at {server.url}  (Ctrl-C to stop)")
        stop.wait()
        clean = server.stop(timeout=grace)
        out("flowlab dashboard stopped" if clean else
            f"flowlab dashboard stopped (its event loop was still busy building a page after {grace} s)")
        return clean
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class ServerThread:
    """The dashboard served from a daemon thread running its own event loop; ``.url``, ``.stop()``."""

    def __init__(self, logdir, port=0, host=LOOPBACK, reload_interval=RELOAD_INTERVAL, frame_ancestors=(),
                 samples=None):
        self._args = (logdir, port, host, reload_interval, frame_ancestors, samples)
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
        await self.server.close()

    @property
    def url(self):
        return self.server.url

    def stop(self, timeout=10):
        """Stop serving and wait up to ``timeout`` seconds for the thread to end (idempotent); returns whether it
        ended."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    def __repr__(self):
        return f"<flowlab dashboard at {self.url}>" if self.server else "<flowlab dashboard (not running)>"



def _serve_child(result_fd, parent, args):
    """``ServerProcess``'s child: report the URL (or the start-up error) on ``result_fd``, then serve until the
    parent stops it or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # a terminal's Ctrl-C reaches the whole group: the parent decides
    try:
        os.nice(5)                                     # training, not the page, gets the CPU when both want it
    except OSError:
        pass

    def report(message):
        try:
            blob = pickle.dumps(message)
        except Exception:                              # an exception that does not pickle: its words still travel
            blob = pickle.dumps(("error", RuntimeError(str(message[1]))))
        while blob:                                    # a pipe to the parent, closed once written
            blob = blob[os.write(result_fd, blob):]
        os.close(result_fd)

    async def main():
        try:
            server = DashboardServer(*args).start()
        except BaseException as e:                     # raised in the parent, where the caller can act on it
            report(("error", e))
            return
        report(("ok", server.url))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        while not stop.is_set() and os.getppid() == parent:    # never outlive a parent that was killed
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
        await server.close()

    asyncio.run(main())


class ServerProcess:
    """The dashboard served by a child process; ``.url``, ``.pid``, ``.stop()``, as ``ServerThread``.

    A fresh interpreter (not a fork: the caller may hold threads and locks; not multiprocessing's spawn, which
    re-runs the caller's main module) runs ``_serve_child`` at a lower priority, and exits when its parent does,
    even when the parent is killed. Start-up errors (the port taken, a bad logdir) are raised here, in the caller."""

    def __init__(self, logdir, port=0, host=LOOPBACK, reload_interval=RELOAD_INTERVAL, frame_ancestors=(),
                 samples=None, start_timeout=60):
        args = (os.fspath(logdir), port, host, reload_interval, tuple(frame_ancestors), samples)
        read_fd, write_fd = os.pipe()
        code = (f"from flowlab.dashboard.server import _serve_child; import pickle, sys; "
                f"_serve_child({write_fd}, {os.getpid()}, pickle.loads(sys.stdin.buffer.read()))")
        try:
            self._process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                             pass_fds=(write_fd,), start_new_session=False)
        finally:
            os.close(write_fd)
        try:
            self._process.stdin.write(pickle.dumps(args))
            self._process.stdin.close()
            blob, deadline, ready = b"", time.monotonic() + start_timeout, True
            while ready:                                # until the child closes its end (or the time is up)
                ready = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))[0]
                chunk = os.read(read_fd, 1 << 16) if ready else b""
                blob += chunk
                ready = ready and chunk
        finally:
            os.close(read_fd)
        if not blob:
            timed_out = self._process.poll() is None
            self.stop(timeout=1)
            raise RuntimeError(f"the dashboard process did not start within {start_timeout} s" if timed_out
                               else "the dashboard process ended before it served")
        kind, value = pickle.loads(blob)
        if kind == "error":
            self._process.wait()
            raise value
        self.url = value

    @property
    def pid(self):
        return self._process.pid

    def stop(self, timeout=10):
        """Stop serving and wait up to ``timeout`` seconds for the child to exit (idempotent); returns whether it
        exited. A child that does not exit in time is killed."""
        if self._process.poll() is None:
            self._process.terminate()                   # SIGTERM: the child closes its server and returns
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        return self._process.poll() is not None

    def __repr__(self):
        return f"<flowlab dashboard at {getattr(self, 'url', '?')} (process {self.pid})>"
