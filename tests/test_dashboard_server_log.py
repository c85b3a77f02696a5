"""Nothing anyone sends makes the dashboard answer 500 or log a traceback, and no logdir URL's credentials reach
its output: a real ``ServerThread`` on 127.0.0.1 asked with raw ``http.client`` requests and Tornado's websocket
client, ``flowlab serve`` as a subprocess, and the store's status line over a credentialed URL."""
import base64
import os
import socket
import logging
import re
import subprocess
import sys
import threading
import time

import pytest

from flowlab.dashboard import server as server_module
from flowlab.dashboard.server import ServerThread
from flowlab.summary import SummaryWriter
from test_dashboard_security import request


class Records(logging.Handler):
    """Every log record of the process while installed (Tornado's and Bokeh's loggers propagate to the root)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def tracebacks(self):
        """The records that carry a traceback or report an uncaught exception, formatted."""
        bad = [r for r in self.records if r.exc_info or "Traceback" in r.getMessage() or "Uncaught" in r.getMessage()
               or "AssertionError" in r.getMessage()]
        return [logging.Formatter().format(r) for r in bad]


@pytest.fixture
def records():
    handler, root = Records(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _logdir(path):
    with SummaryWriter(path / "run", flush_secs=0.1) as w:
        for i in range(20):
            w.add_scalar("loss", 1.0 / (i + 1), i)
    return path


# ----------------------------------------------------------------------------------------------------- requests

def test_an_options_request_without_origin_is_answered_without_a_traceback(tmp_path, records):
    handle = ServerThread(_logdir(tmp_path), port=0, reload_interval=0.2)
    try:
        port = handle.server.port
        for path in ["/autoload.js", "/autoload.js?bokeh-autoload-element=x"]:
            status, headers, body = request(port, path, method="OPTIONS")
            assert (status, headers["Allow"], body) == (204, "GET, OPTIONS", b""), (path, status, body[:300])
        assert request(port, "/", method="OPTIONS")[0] == 405              # the page itself takes no OPTIONS, as before
        # a real preflight from the dashboard's own origin still gets Bokeh's CORS answer
        origin = f"http://127.0.0.1:{port}"
        status, headers, _ = request(port, "/autoload.js", headers={"Origin": origin}, method="OPTIONS")
        assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    finally:
        handle.stop()
    assert not records.tracebacks(), records.tracebacks()[0]
    assert not [r for r in records.records if re.match(r"500 ", r.getMessage())]


# ----------------------------------------------------------------------------------------------------- websocket

def _token(port):
    status, _, body = request(port)
    assert status == 200, body[:300]
    return re.search(rb'"token":"([^"]+)"', body).group(1).decode()


def _frame(payload: bytes, opcode=0x1):
    """One masked client frame (RFC 6455; payloads under 126 bytes)."""
    mask = os.urandom(4)
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _raw_websocket(port, token):
    """A websocket opened by hand on a plain socket, so the test decides when (and whether) the client answers;
    returns it with the bytes that came after the handshake's headers."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\n"
                  f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Protocol: bokeh,{token}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head[:200]
    return sock, head.partition(b"\r\n\r\n")[2]


@pytest.fixture
def fast_pings(tmp_path, monkeypatch):
    """A ``ServerThread`` whose Bokeh pings every websocket each 5 ms (37 s by default), so a ping lands in every
    window where a socket is closing but its ``on_close`` has not come yet; yields (handle, port)."""
    monkeypatch.setattr(server_module, "KEEP_ALIVE_MS", 5)
    handle = ServerThread(_logdir(tmp_path), port=0, reload_interval=0.2)
    try:
        yield handle, handle.server.port
    finally:
        handle.stop()


def _all_lost(handle):
    deadline = time.monotonic() + 10
    while handle.server._tornado.live and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)                             # the sockets' on_close ran
    return not handle.server._tornado.live


def test_a_websocket_lost_after_the_server_closed_it_leaves_no_traceback(fast_pings, records):
    """The server closes a websocket (here for a binary frame, which is not Bokeh's protocol) and waits for the
    client's close frame; a client that is gone, or busy, does not send it. Meanwhile Bokeh's keep-alive pings:
    the socket is closing, so the ping reports the client lost, which detaches its session; when the connection
    finally ends, the socket's ``on_close`` reads that session: ``AssertionError`` at
    ``bokeh/server/connection.py:65``. The same happens when a busy loop handles a close frame and an overdue ping
    in one iteration."""
    handle, port = fast_pings
    for _ in range(3):
        sock, after = _raw_websocket(port, _token(port))
        try:
            while not after:                    # Bokeh's ACK: the connection and its session are set up
                after += sock.recv(4096)
            sock.sendall(_frame(b"not a bokeh message", opcode=0x2))
            time.sleep(0.2)                     # the server's close frame and many pings come; no answer goes
        finally:
            sock.close()                        # the connection ends without a close handshake
    assert _all_lost(handle)                    # every connection was reported lost, once
    assert not records.tracebacks(), records.tracebacks()[0]
    assert not [r for r in records.records if "AssertionError" in r.getMessage()]


def test_a_message_before_the_websocket_is_set_up_leaves_no_traceback(fast_pings, records):
    """Bokeh sets a websocket up in a callback after ``open``; a client that speaks at once (before Bokeh's ACK)
    met no receiver: ``AttributeError`` logged with a traceback. Its message now waits for the set-up and is then
    handled as any other (a binary frame: a protocol error, the socket closed)."""
    handle, port = fast_pings
    for _ in range(3):
        sock, _ = _raw_websocket(port, _token(port))
        try:
            sock.sendall(_frame(b"not a bokeh message", opcode=0x2))
            time.sleep(0.2)
        finally:
            sock.close()
    assert _all_lost(handle)
    assert not records.tracebacks(), records.tracebacks()[0]
    assert [r for r in records.records if "protocol error" in r.getMessage()]     # it was handled, not dropped


# ----------------------------------------------------------------------------------------------------- session ids

def _unsigned_token(session_id):
    """A token as Bokeh's client sends it, for ``session_id``, with no signature: what anyone can write."""
    import json
    payload = json.dumps({"session_id": session_id, "session_expiry": int(time.time()) + 300}).encode()
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def test_session_ids_and_tokens_the_server_did_not_issue_are_refused(tmp_path, records):
    """A client named the session it got: ``GET /?bokeh-session-id=../../x`` made a session of that id (answered
    200), the id of a live session joined it (its page, then over the websocket with a token anyone can write), and a
    malformed ``bokeh-token`` was a 500 with a traceback. The ids never reached a path (Bokeh keeps sessions in a
    dict), but taking them as they came let any client act in another's session once it knew its id. Ids and tokens
    are now signed with a key of the server's own (made at each start); others are refused, 403 on the page,
    closed on the websocket, with nothing but a status line or a warning in the log."""
    from bokeh.util.token import generate_session_id, get_session_id
    from test_dashboard_security import websocket

    handle = ServerThread(_logdir(tmp_path), port=0, reload_interval=0.2)
    try:
        port, tornado = handle.server.port, handle.server._tornado
        status, _, body = request(port)
        assert status == 200
        token = re.search(rb'"token":"([^"]+)"', body).group(1).decode()
        own = get_session_id(token)
        sessions = lambda: sorted(session.id for session in tornado.get_sessions("/"))
        assert sessions() == [own] and "." in own                     # an id and its signature
        other_server = generate_session_id(secret_key=os.urandom(32), signed=True)
        for forged in ["../../x", "../../../etc/passwd", own.split(".")[0], own.split(".")[0] + ".AAAA",
                       other_server, "%0aINFO:forged"]:
            status, headers, body = request(port, f"/?bokeh-session-id={forged}")
            assert (status, body) == (403, b"bokeh-session-id was not issued by this server\n"), (forged, status)
            assert headers["Content-Type"].startswith("text/plain")
        status, _, body = request(port, "/", headers={"Bokeh-Session-Id": "../../x"})
        assert status == 403 and b"not issued by this server" in body
        for forged in ["abc", _unsigned_token(own), _unsigned_token("../../x")]:
            status, _, body = request(port, f"/?bokeh-token={forged}")
            assert (status, body) == (403, b"bokeh-token was not issued by this server\n"), (forged, status)
        assert sessions() == [own]                                     # none made, none joined
        # over the websocket: a token that names a live session (or any other) without the signature, garbage
        for forged in [_unsigned_token(own), _unsigned_token("../../y"), "not-a-token!"]:
            assert websocket(port, f"127.0.0.1:{port}", None, forged) == "closed", forged
        assert sessions() == [own]
        assert websocket(port, f"127.0.0.1:{port}", None, token) == "open"    # the page's own token still works
        # The id the server issued is the session's key, as in any Bokeh server: its holder gets that session.
        status, _, body = request(port, f"/?bokeh-session-id={own}")
        assert status == 200 and get_session_id(re.search(rb'"token":"([^"]+)"', body).group(1).decode()) == own
        assert sessions() == [own]
    finally:
        handle.stop()
    assert not records.tracebacks(), records.tracebacks()[0]
    assert not [r for r in records.records if re.match(r"500 ", r.getMessage())]
    refusals = [r.getMessage() for r in records.records if "refused: no session token" in r.getMessage()]
    assert len(refusals) == 3 and not any("../../y" in m for m in refusals)     # nothing of the client's in the log
