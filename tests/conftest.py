import os

import pytest

os.environ.setdefault("FLOWLAB_DEVICE", "cpu")   # tests run on NumPy; GPU tests opt in with @pytest.mark.gpu


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
def fresh_session():
    """Each test starts with no variables and names counted from 0, as a new process would."""
    import flowlab as flow
    flow.clear_default_session()
    yield
    flow.clear_default_session()
