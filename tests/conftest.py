import os

import pytest

# Tests run on NumPy; GPU tests opt in with @pytest.mark.gpu. ``FLOWLAB_DEVICE=gpu pytest`` runs the whole suite on
# CuPy instead (issue 13): every test then starts on the GPU, whatever the test before it switched to, except tests
# marked numpy_backend (NumPy-only paths), which start on NumPy whatever FLOWLAB_DEVICE says.
DEVICE = os.environ.setdefault("FLOWLAB_DEVICE", "cpu")


def _cuda_works():
    try:
        import cupy
        return cupy.cuda.is_available() and cupy.zeros(1).sum().item() == 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _cuda_works():
        skip = pytest.mark.skip(reason="needs a working CUDA device with CuPy")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_session(request):
    """Each test starts with no variables and names counted from 0, as a new process would, on the backend
    FLOWLAB_DEVICE names (on NumPy if the test is marked numpy_backend)."""
    import flowlab as flow
    from flowlab.runtime import backend
    flow.clear_default_session()
    device = "cpu" if request.node.get_closest_marker("numpy_backend") else DEVICE
    if device in ("cpu", "gpu") and backend.current().name != ("cupy" if device == "gpu" else "numpy"):
        backend.use(device)
    yield
    flow.clear_default_session()
    flow.config.seed(0)     # the seed outlives a cleared session (as in OneFlow); a test's must not reach the next


# The browser tests' Jupyter server and Chromium (tests/jupyter_page.py), one per test module that asks for them.

@pytest.fixture(scope="module")
def jupyter_server(tmp_path_factory):
    """A ``JupyterServer`` on 127.0.0.1 serving JupyterLab 4 and Notebook 7."""
    from jupyter_page import JupyterServer
    with JupyterServer(tmp_path_factory.mktemp("jupyter")) as server:
        yield server


@pytest.fixture(scope="module")
def chromium():
    """Debian's headless chromium, through Playwright."""
    from playwright.sync_api import sync_playwright

    from jupyter_page import launch_chromium
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        yield browser
        browser.close()


# A real S3-compatible server for the tests of s3:// logdirs (test_remote_logdir, test_dashboard_s3).

@pytest.fixture(scope="module")
def s3_endpoint():
    """``http://127.0.0.1:PORT`` of a moto S3 server running for the test module (s3fs and boto3 talk to it over
    HTTP with dummy credentials, exactly as they talk to AWS: no client is mocked)."""
    import logging

    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)      # one log line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
