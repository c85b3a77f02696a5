"""Credentials in logdir URLs never reach the dashboard's output: ``redact`` itself, the store's status line over a
credentialed URL, the tailer's error map, and ``flowlab serve`` given an http:// URL with a password (refused, by a
message that names the URL without it; there is a real HTTP server on 127.0.0.1 behind the URL)."""
import http.server
import subprocess
import sys
import threading
import time

import fsspec
import pytest

from flowlab.dashboard.store import Store
from flowlab.dashboard.views.status import status_html
from flowlab.summary import LogdirTailer, SummaryWriter
from flowlab.summary.redact import redact
from flowlab.summary.tailer import LogdirError

SECRET = "S3CRET-pw"


@pytest.mark.parametrize("text, shown", [
    (f"http://alice:{SECRET}@host/logs", "http://alice:***@host/logs"),
    (f"https://alice:{SECRET}@host:8443/a/b?x=1", "https://alice:***@host:8443/a/b?x=1"),
    ("http://alice:p@ss@host/x", "http://alice:***@host/x"),                     # an '@' inside the password
    ("https://ghp_TOKEN@github.com/o/r", "https://***@github.com/o/r"),          # a lone userinfo is the secret
    ("s3://b/p?X-Amz-Signature=abc&X-Amz-Credential=AKIA%2F1&versionId=3",
     "s3://b/p?X-Amz-Signature=***&X-Amz-Credential=***&versionId=3"),
    ("https://a.blob.core.windows.net/c?sv=2022&sig=zz%3D&se=1", "https://a.blob.core.windows.net/c?sv=2022&sig=***&se=1"),
    ("http://h/p?token=t0k#access_token=a", "http://h/p?token=***#access_token=***"),
    (f"logdir 'http://bob:{SECRET}@h/x?api_key=k': refused", "logdir 'http://bob:***@h/x?api_key=***': refused"),
    ("/home/alice:pw@box/runs", "/home/alice:pw@box/runs"),                      # not a URL: untouched
    ("http://host/a@b?page=2", "http://host/a@b?page=2"),                        # '@' in a path, harmless parameter
])
def test_redact_hides_passwords_and_secret_parameters(text, shown):
    assert redact(text) == shown


def _event_file_bytes(tmp_path):
    with SummaryWriter(tmp_path / "run", flush_secs=0.1) as w:
        for i in range(5):
            w.add_scalar("loss", 1.0 / (i + 1), i)
    (path,) = (tmp_path / "run").iterdir()
    return path.name, path.read_bytes()


def test_the_status_line_over_a_url_with_a_token_shows_no_secret(tmp_path):
    """A logdir URL carrying a token (as signed URLs do), read through fsspec: the page's status line and the
    store's status name it with the token hidden, and so do the tailer's errors (keyed by such URLs)."""
    fs = fsspec.filesystem("memory")
    root = f"memory://store/logs?token={SECRET}"
    name, data = _event_file_bytes(tmp_path)
    fs.pipe(f"{root}/run/{name}", data)
    try:
        store = Store(root)
        store.poll()
        status = store.status()
        assert status["runs"] == 1 and status["records_read"] > 0            # the URL was read, not refused
        line = status_html(status)
        assert "/store/logs?token=***</code>" in line and SECRET not in line
        assert SECRET not in repr(status)
        fs.rm(f"{root}/run/{name}")                                         # now it vanished: an error entry
        store.poll()
        status = store.status()
        assert status["errors"] and SECRET not in repr(status) and SECRET not in status_html(status)
    finally:
        for key in [k for k in fs.store if k.startswith("/store/logs?token=")]:
            del fs.store[key]                   # the memory filesystem is shared by the whole process


def test_an_http_logdir_is_refused_naming_the_url_without_credentials():
    with pytest.raises(LogdirError) as caught:
        LogdirTailer(f"http://alice:{SECRET}@127.0.0.1:9/logs?token=t0k")
    message = str(caught.value)
    assert "http://alice:***@127.0.0.1:9/logs?token=***" in message and SECRET not in message
    assert "s3://" in message and "local path" in message and caught.value.__cause__ is None
    with pytest.raises(LogdirError, match=r"https://\*\*\*@h/x"):
        LogdirTailer("https://ghp_TOKEN@h/x")


class _Index(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):               # keep the test's output clean
        pass


def test_flowlab_serve_with_a_password_in_an_http_logdir_never_prints_it(tmp_path):
    """A real HTTP server on 127.0.0.1 serving a logdir's directory index: today's HTTP listing has no sizes, so
    ``flowlab serve`` refuses the URL at startup, with a message that names it redacted and says what is
    supported; no traceback, no password anywhere in its output."""
    _event_file_bytes(tmp_path)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            lambda *a: _Index(*a, directory=str(tmp_path)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://alice:{SECRET}@127.0.0.1:{httpd.server_address[1]}/"
    proc = subprocess.Popen([sys.executable, "-m", "flowlab.cli", "serve", "--logdir", url, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=25)
    except subprocess.TimeoutExpired:           # the old behaviour: serving, with the password on stdout
        proc.kill()
        out, err = proc.communicate()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert SECRET not in out + err, out + err
    assert proc.returncode == 2 and out == ""
    assert err.startswith("flowlab serve: logdir 'http://alice:***@127.0.0.1:") and "Traceback" not in err
    assert "cannot list a directory" in err and "s3://" in err


def test_a_broken_views_traceback_on_the_page_quotes_no_password():
    from flowlab.dashboard.app import _broken
    try:
        raise OSError(f"cannot list http://alice:{SECRET}@host/logs/run")
    except OSError as error:
        text = _broken("Scalars", error).text
    assert "http://alice:***@host/logs/run" in text and SECRET not in text
