"""The ``flowlab`` command's own behaviour (``--version``, no command, how ``serve`` takes its logdir),
``flowlab.dashboard.show`` outside and inside a Jupyter kernel, and the one log line that says flowlab runs on
NumPy."""
import logging
import re
import subprocess
import sys
import urllib.request

import pytest

import flowlab
from flowlab.errors import DeviceError
from flowlab.runtime import backend


def flowlab_command(*args):
    return subprocess.run([sys.executable, "-m", "flowlab.cli", *args], capture_output=True, text=True, timeout=120)


def test_version_prints_the_version():
    done = flowlab_command("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"flowlab {flowlab.__version__}\n", "")


def test_no_command_prints_usage_and_fails_as_argparse_does():
    done = flowlab_command()
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: flowlab [-h] [--version] COMMAND")
    assert "demo" in done.stderr and "serve" in done.stderr


def test_show_outside_jupyter_prints_the_url(tmp_path, capsys):
    from flowlab.dashboard import show
    handle = show(tmp_path)
    try:
        out = capsys.readouterr().out
        assert out == f"flowlab dashboard for {tmp_path} at {handle.url}  (stop it with .stop())\n"
        assert "IFrame" not in out and re.fullmatch(r"http://127\.0\.0\.1:\d+/", handle.url)
        with urllib.request.urlopen(handle.url, timeout=30) as response:
            assert response.status == 200
    finally:
        handle.stop()


def test_show_in_a_jupyter_kernel_displays_an_iframe(tmp_path, capsys, monkeypatch):
    import IPython
    import IPython.display
    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: type("Kernel", (), {"kernel": object()})())
    monkeypatch.setattr(IPython.display, "display", shown.append)
    from flowlab.dashboard import show
    handle = show(tmp_path, height=500)
    try:
        (frame,) = shown
        assert isinstance(frame, IPython.display.IFrame) and (frame.src, frame.height) == (handle.url, 500)
        assert capsys.readouterr().out == ""
    finally:
        handle.stop()


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_running_on_numpy_is_said_in_one_plain_sentence(monkeypatch):
    monkeypatch.setattr(backend, "_current", backend._current)      # restored after the test
    monkeypatch.setitem(sys.modules, "cupy", None)                  # import cupy fails, as without CuPy
    lines = Lines()
    logger = logging.getLogger("flowlab")
    logger.addHandler(lines)
    level = logger.level
    try:
        logger.setLevel(logging.INFO)
        assert backend.select("auto") is backend.NUMPY
    finally:
        logger.setLevel(level)
        logger.removeHandler(lines)
    said = ("flowlab: running on NumPy without a GPU, as CuPy is not installed; install flowlab[cuda12] or "
            "flowlab[cuda13] to use one.")
    assert lines.lines == [said]
    assert flowlab.device() == said
    with pytest.raises(DeviceError, match=r"^FLOWLAB_DEVICE=gpu asks for a GPU, but CuPy is not installed; "
                                          r"install flowlab\[cuda12\] or flowlab\[cuda13\] to use one$"):
        backend.select("gpu")


def test_the_backend_notice_stays_off_stderr_and_is_available_on_request():
    """A notebook draws anything on stderr as a red error box, so the normal 'no GPU' notice must not go there;
    flow.device() says it, and it is logged at INFO for applications that turn logging on."""
    program = ("import logging, flowlab as flow\n"
               "flow.device()\n"
               "logging.getLogger('flowlab').warning('a real warning')\n"
               "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n"
               "from flowlab.runtime import backend\n"
               "backend.select('cpu')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "FLOWLAB_DEVICE": "auto"})
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    # the first choice said nothing; the warning still reached stderr; with INFO logging on, the notice is logged
    assert lines == ["a real warning", "INFO flowlab: running on NumPy, as FLOWLAB_DEVICE=cpu asks."], lines
    assert done.stdout == ""


def test_serve_takes_the_logdir_as_its_argument(tmp_path):
    """``flowlab serve DIR`` as ``flowlab serve --logdir DIR`` (TensorBoard's spelling stays)."""
    import signal
    proc = subprocess.Popen([sys.executable, "-m", "flowlab.cli", "serve", str(tmp_path), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"flowlab dashboard for {tmp_path} at http://127.0.0.1:"), line
        url = re.search(r"http://\S+", line).group(0)
        assert urllib.request.urlopen(url, timeout=60).status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


@pytest.mark.parametrize("args, says", [
    ((), "which logdir? give it as flowlab serve LOGDIR (or --logdir LOGDIR)"),
    (("a", "--logdir", "b"), "two logdirs given, 'a' and --logdir 'b'; give one"),
])
def test_serve_without_one_logdir_says_so(args, says):
    done = flowlab_command("serve", *args, "--port", "0")
    assert (done.returncode, done.stdout) == (2, "") and done.stderr == f"flowlab serve: {says}\n"


def test_a_file_as_logdir_is_refused_with_its_folder_named(tmp_path):
    from flowlab.summary import SummaryWriter
    with SummaryWriter(tmp_path / "run") as w:
        w.add_scalar("loss", 1.0, 0)
    (event_file,) = (tmp_path / "run").glob("*tfevents*")
    for option in ((), ("--logdir",)):
        done = flowlab_command("serve", *option, str(event_file), "--port", "0")
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr == (f"flowlab serve: logdir {str(event_file)!r} is a file; expected a folder of runs (a "
                               f"folder holding *tfevents* files, or their parent folder); its folder "
                               f"{str(tmp_path / 'run')!r} holds it as a run\n")
    (tmp_path / "notes.txt").write_text("not a logdir")
    done = flowlab_command("serve", str(tmp_path / "notes.txt"), "--port", "0")
    assert done.returncode == 2 and "is a file; expected a folder of runs" in done.stderr and "No logdir" not in \
        done.stderr and "its folder" not in done.stderr
