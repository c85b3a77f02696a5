"""In a notebook, flowlab's messages name the cell of a source line as IPython's tracebacks do (``Cell In[3], line 7``),
not the kernel's temporary file; outside IPython they keep ``path:line``. Run in a real kernel (nbclient)."""
import re

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import AnomalyError, ShapeError
from flowlab.graph import describe_location

CELLS = ["""\
import numpy as np
import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import AnomalyError, ShapeError
config = flow.function_config()
config.detect_anomaly(True)
""", """\
@flow.global_function(function_config=config)
def anomalous(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
    y = flow.math.exp(x)

    z = flow.math.log(y - 1.0)          # line 5: log(0) for x = 0
    return z
""", """\
try:
    anomalous(np.array([0.0, 2.0, 3.0], np.float32))
except AnomalyError as e:
    print("ANOMALY", e)
""", """\
reports = []

@flow.global_function(type="train")
def diverging(x: tp.Numpy.Placeholder((8, 4)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
    h = flow.layers.dense(x, 16, activation=flow.nn.relu, name="hidden")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.layers.dense(h, 3, name="output"))
    flow.watch_health(reports.append)
    flow.optimizer.SGD(1e6, momentum=0).minimize(loss)
    return loss

rng = np.random.default_rng(0)
with np.errstate(all="ignore"):
    for _ in range(30):
        diverging((rng.normal(size=(8, 4)) * 100).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
flow.sync_default_session()
nan = [a.message for r in reports for a in r.alerts if a.kind == "nan"]
print("HEALTH", nan[0] if nan else "no nan alert")
""", """\
@flow.global_function()
def misshapen(a: tp.Numpy.Placeholder((2, 3)), b: tp.Numpy.Placeholder((4, 5))) -> tp.Numpy:
    return flow.matmul(a, b)
try:
    misshapen(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))
except ShapeError as e:
    print("SHAPE", e)
""", """\
@flow.global_function()
def located(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
    y = flow.math.relu(x)
    print("LOCATION", y.location)
    return y
located(np.ones(2, np.float32));
"""]


@pytest.fixture(scope="module")
def outputs():
    for module in ("nbclient", "nbformat", "ipykernel"):
        pytest.importorskip(module)
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    # a cell's stdout may come in several stream messages: join them, then cut at the markers the cells print
    printed = "".join(o["text"] for cell in nb.cells for o in cell.outputs if o.get("name") == "stdout")
    found = re.split(r"^(ANOMALY|HEALTH|SHAPE|LOCATION) ", printed, flags=re.M)
    return dict(zip(found[1::2], found[2::2]))


def test_anomaly_error_names_the_cell_and_line(outputs):
    text = outputs["ANOMALY"]
    assert re.search(r"op Log_\d+ \(Log\)", text)
    assert "(at Cell In[2], line 5)" in text and not re.search(r"ipykernel_\d+", text)


def test_health_nan_alert_names_the_cell(outputs):
    text = outputs["HEALTH"]
    assert "Cell In[4], line " in text and not re.search(r"ipykernel_\d+", text), text


def test_trace_errors_name_the_cell(outputs):
    text = outputs["SHAPE"]
    assert text.rstrip().endswith("(at Cell In[5], line 3)") and not re.search(r"ipykernel_\d+", text), text


def test_a_tensors_location_is_the_stack_ipython_would_print(outputs):
    text = outputs["LOCATION"]
    # the cell's frame as IPython's traceback names it, then its code line
    assert "  Cell In[6], line 3, in located\n    y = flow.math.relu(x)" in text, text
    assert not re.search(r"ipykernel_\d+", text)          # the kernel's temporary file of the cell


def test_outside_ipython_a_line_is_file_and_number():
    assert describe_location("/work/train.py", 12) == "/work/train.py:12"
    config = flow.function_config()
    config.detect_anomaly(True)

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return flow.math.log(x)

    with pytest.raises(AnomalyError, match=re.escape(__file__) + r":\d+\)"):
        job(np.zeros(2, np.float32))
    with pytest.raises(ShapeError, match=re.escape(__file__) + r":\d+\)$"):
        @flow.global_function()
        def misshapen(a: tp.Numpy.Placeholder((2, 3)), b: tp.Numpy.Placeholder((4, 5))) -> tp.Numpy:
            return flow.matmul(a, b)
        misshapen(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))
