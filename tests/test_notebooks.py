"""Every notebook under notebooks/ runs top to bottom in a real Jupyter kernel (nbclient)."""
import pathlib
import re

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def execute(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def text_output(nb):
    return "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []))


def test_every_notebook_is_checked():
    assert {p.name for p in NOTEBOOKS} <= set(CHECKS), "add a check for each notebook"


def check_train_digits(nb):
    accuracy = float(re.search(r"final test accuracy: ([0-9.]+)", text_output(nb)).group(1))
    assert accuracy > 0.95
    assert "hidden_matmul" in text_output(nb)


def cell_texts(nb):
    """The printed text (stdout and stderr) of each code cell, in order."""
    return ["".join(o.get("text", "") for o in cell.get("outputs", []))
            for cell in nb.cells if cell.cell_type == "code"]


WIDGET = "application/vnd.jupyter.widget-view+json"


def widget_views(nb):
    return sum(WIDGET in o.get("data", {})
               for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []))


def printed_array(text):
    return np.array(text.split(), dtype=np.float64)


def check_watch_relu(nb):
    out = text_output(nb)
    # both jobs: the tp.Numpy handler ("out:") and the FixedTensorDef/.ndarray() one ("out"), arrays may wrap lines
    pairs = re.findall(r"in:\s*\[([^\]]*)\]\s*out:?\s*\[([^\]]*)\]", out)
    assert [len(printed_array(x)) for x, _ in pairs] == [5, 10]
    for x, y in pairs:
        x, y = printed_array(x), printed_array(y)
        assert (x < 0).any() and (x > 0).any()
        np.testing.assert_array_equal(y, np.maximum(x, 0))     # the same float32 values print the same
    assert "callbacks done when the -> None job returned: 0" in out
    assert "callbacks done after sync_default_session(): 1" in out
    assert "callbacks done when the -> tp.Numpy job returned: 1" in out
    assert "callback thread: flowlab-watch-dispatcher" in out
    assert "watched value equals the returned value: True" in out


def check_watch_diff(nb):
    out = text_output(nb)
    assert "logits (100, 10) float32" in out and "logits_grad (100, 10) float32" in out
    difference = float(re.search(r"max abs difference from softmax - onehot: (\S+)", out).group(1))
    row_sum = float(re.search(r"max abs row sum of logits_grad: (\S+)", out).group(1))
    assert difference < 1e-5 and row_sum < 1e-5
    losses = [float(v) for v in re.findall(r"step +\d+: loss ([0-9.]+)", out)]
    assert len(losses) >= 3 and losses[-1] < losses[0]      # it trains


def check_watch_scope(nb):
    text = next(t for t in cell_texts(nb) if t.startswith("view watched tensors"))
    values, grads = text.split("view watched grad tensors\n")
    values = values.splitlines()[1:]
    grads = grads.splitlines()
    n = {m.group(1) for line in values + grads for m in [re.match(r"Dense_(\d+)[-_]", line)] if m}
    assert len(n) == 1, f"one Dense_<n> for every key, got {values + grads}"
    n = n.pop()
    oneflow_keys = [f"Dense_{n}-bias/out", f"Dense_{n}-weight/out", f"Dense_{n}_matmul/out_0",
                    f"Dense_{n}_bias_add/out_0"]
    assert values == oneflow_keys
    assert sorted(grads) == sorted(oneflow_keys)
    out = text_output(nb)
    for label in ("bias gradient vs batch sum of output gradient", "bias_add vs matmul \\+ bias"):
        assert float(re.search(label + r": max abs difference (\S+)", out).group(1)) < 1e-5
    # the callable (blob, blob_def) form saw every tensor of its block
    for lbn in ("head-bias/out", "head-weight/out", "head_matmul/out_0", "head_bias_add/out_0"):
        assert re.search(rf"^{lbn} +shape", out, re.M), lbn
    assert re.search(r"^Sigmoid_\d+/out_0 +shape \(8, 3\)", out, re.M)
    assert "hidden TensorStats(shape=(8, 64)" in out and "logits_grad TensorStats(shape=(8, 10)" in out
    assert out.count("stats agree with NumPy on the full tensor: True") == 2


def check_debug_diverging(nb):
    out = text_output(nb)
    assert "failed to refresh" not in out and "Traceback" not in out
    assert widget_views(nb) == 4            # a WatchPanel and a TrainingProgress, before and after the fix
    diverged = out.index("the loss was first non-finite")
    anomaly = out.index("AnomalyError at step")
    fixed = out.index("final test accuracy")
    assert re.search(r"step +\d+: loss nan", out[:diverged]), "the loss never became nan before the fix"
    assert re.search(r"step +\d+: loss .*1000 NaN", out[:diverged])   # the stats watch saw the NaN gradient
    assert diverged < anomaly < fixed
    message = out[anomaly:out.index("the op was created")]
    assert "produced" in message and re.search(r"op Log_\d+ \(Log\)", message)
    assert re.search(r"\(at Cell In\[\d+\], line \d+\)", message), "the message names the notebook cell and line"
    assert re.search(r"ReduceSum_\d+/out_0 float32\[100\]: min 0 ", message)     # the log's input hit 0
    assert "return -flow.math.log(p_true)" in out[anomaly:]
    assert "all losses finite: True" in out[fixed - 200:]
    assert float(re.search(r"final test accuracy: ([0-9.]+)", out).group(1)) > 0.9


def check_summaries_dashboard(nb):
    out = text_output(nb)
    assert "Traceback" not in out
    written = re.search(r"written by the in-job API: (\[.*\])", out).group(1)
    assert written == "['events.out.tfevents.*', 'points_00001', 'projector_config.pbtxt', 'structure_graph.json']"
    # flowlab's reader found every kind, from both APIs
    oneflow = out[out.index("\noneflow_api\n"):out.index("\nsummary_writer\n")]
    for line in ("scalars    {'accuracy': 1, 'scalar': 10}", "histograms {'histogram': 10}",
                 "images     {'image': '16x16x2'}", "text       {'text': ['vgg16', 'resnet50', 'mask-rcnn', 'yolov3']}",
                 "graphs     1", "projector  [('points', 1, (30, 8))]"):
        assert line in oneflow, line
    assert "hparams    {'dense_layers': 5.0, 'learning_rate': 0.02, 'optimizer': 'adam'}" in oneflow
    torch = out[out.index("\nsummary_writer\n"):out.index("\nsummary_writer/curves_a\n")]
    for line in ("scalars    {'final_loss': 1, 'train/loss': 20}", "histograms {'hidden/weight': 20}",
                 "images     {'batch': '16x16x2', 'noise': '12x12x1'}", "text       {'notes': 'trained **20** steps'}",
                 "hparams    {'hidden': 16.0, 'lr': 0.1}", "graphs     1", "projector  [('points', 0, (30, 8))]"):
        assert line in torch, line
    assert out.count("scalars    {'curves': 20}") == 2                  # add_scalars: a run per curve
    # the dashboard was shown (an IFrame of its URL), answered, and stopped
    frames = [o.data["text/html"] for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
              if "text/html" in o.get("data", {})]
    assert len(frames) == 1 and re.search(r'<iframe[^>]*src="http://127\.0\.0\.1:\d+/"', frames[0], re.S)
    assert "the dashboard answered HTTP 200 with Bokeh in the page" in out
    assert "stopped: the URL no longer answers" in out


def check_checkpoints_finetuning(nb):
    out = text_output(nb)
    assert "Traceback" not in out
    assert float(re.search(r"digits: .* test accuracy ([0-9.]+)", out).group(1)) > 0.9
    assert out.count("equal to the trained values: True") == 2              # CheckPoint.save and checkpoint.save
    assert re.search(r"warning: checkpoint '<models>/digits_checkpoint' has no values for variables "
                     r"\['parity_head-weight', 'parity_head-bias', 'parity_head-weight-momentum', "
                     r"'parity_head-bias-momentum'\]", out)
    pattern = r"{}: hidden loaded from the checkpoint: (\w+); first loss ([0-9.]+), last ([0-9.]+); parity " \
              r"accuracy ([0-9.]+)"
    tuned = re.search(pattern.format("fine-tuned"), out).groups()
    scratch = re.search(pattern.format("from scratch"), out).groups()
    assert tuned[0] == "True" and scratch[0] == "False"
    (t_first, t_last, t_accuracy), (s_first, s_last, s_accuracy) = map(float, tuned[1:]), map(float, scratch[1:])
    assert t_last < t_first and s_last < s_first                            # both train
    assert t_last < s_last and t_accuracy > s_accuracy > 0.6                # the trained backbone helps
    assert t_accuracy > 0.8


def check_multi_device(nb):
    out = text_output(nb)
    assert "Traceback" not in out and "Warning" not in out
    # the consistent view: 2 devices train as 1 from the same initial weights, the losses come back whole
    runs = re.findall(r"(\d) device\(s\): 42 steps, losses per step \(100,\), mean loss first ([0-9.]+) last "
                      r"([0-9.]+), test accuracy ([0-9.]+)", out)
    assert [devices for devices, *_ in runs] == ["1", "2"]
    (_, *one), (_, *two) = runs
    assert one == two                                                # printed to 4 decimals
    first, last, accuracy = map(float, one)
    assert last < first / 5 and accuracy > 0.9                       # it trains
    for what in ("losses", "final weights"):
        assert float(re.search(rf"max abs difference of the {what}, 2 devices vs 1: (\S+)", out).group(1)) < 1e-5
    assert float(re.search(r"largest change of a weight during training: ([0-9.]+)", out).group(1)) > 0.1
    # the mirrored view: one piece a device in, out and in the tp.ListNumpy watch handler
    assert "watched hidden activations, per device: [(60, 64), (40, 64)]" in out
    assert "predictions, per device: [(60,), (40,)]" in out
    device_accuracies = [float(a) for a in re.findall(r"device [01]: accuracy ([0-9.]+)", out)]
    assert len(device_accuracies) == 2 and min(device_accuracies) > 0.8
    assert re.search(r"FeedError: job mirrored_predict argument 'images': expected a list of 2 numpy.ndarray, one "
                     r"for each of the 2 devices .* got list of length 1", out)
    assert re.search(r"FeedError: job consistent_predict argument 'images': the consistent view splits the batch "
                     r".* but shape \(99, 1, 8, 8\) has 99 rows", out)
    assert "after clear_default_session, devices: 1" in out


def check_network_health(nb):
    out = text_output(nb)
    assert "Traceback" not in out and "failed to refresh" not in out
    assert widget_views(nb) == 5                                   # a HealthPanel per case
    _, dead, deep, diverging, frozen, healthy = cell_texts(nb)
    alerted = lambda text, kind: re.search(rf"^alert {kind}: (.*) \(\d+ in all\)$", text, re.M)   # noqa: E731
    assert alerted(dead, "dead_relu").group(1).startswith("hidden_0")      # the first dead layer, forward order
    assert re.fullmatch(r"hidden_\d", alerted(deep, "vanishing_gradient").group(1))   # among the first ten
    assert alerted(diverging, "nan") and (alerted(diverging, "exploding_gradient") or
                                          alerted(diverging, "update_ratio"))
    # the nan alert names the first op that made NaN/Inf and the notebook line that created it
    assert re.search(r"op hidden_\d_\w+ \(hidden_\d_\w+/out_0, at Cell In\[\d+\], line \d+\)", diverging)
    assert "loss: first" in diverging and diverging.split("loss: first")[1].split("\n")[0].endswith("last nan")
    assert alerted(frozen, "update_ratio").group(1).split(", ") == ["hidden_0", "hidden_1", "output"]
    assert "no alerts" in healthy and "alert " not in healthy
    first, last = map(float, re.search(r"loss: first ([\d.]+), last ([\d.]+)", healthy).groups())
    assert last < first / 10                                        # it learns


def check_cnn_health(nb):
    out = text_output(nb)
    assert "Traceback" not in out and "failed to refresh" not in out
    assert widget_views(nb) == 3                                   # a HealthPanel per case
    data, examples, _, healthy, too_fast, no_bn, summary = cell_texts(nb)
    assert "640 JPEG records in 4 part files: part-00000, part-00001, part-00002, part-00003" in data
    assert any("image/png" in o.get("data", {}) for o in nb.cells[3].outputs)        # the examples, decoded back
    alerted = lambda text, kind: re.search(rf"^alert {kind}: (.*) \(\d+ in all\)$", text, re.M)   # noqa: E731
    # healthy: learns, and no alert although its residual branches start with no gradient
    assert "no alerts" in healthy and "alert " not in healthy
    first, last = map(float, re.search(r"loss: first ([\d.]+), mean of the last 5 ([\d.]+)", healthy).groups())
    assert last < first / 2
    # lr 10: fc (the layer no batch norm protects) overwritten first; dead ReLUs on batch norms, not convs
    assert alerted(too_fast, "update_ratio").group(1).startswith("fc, ")
    dead = alerted(too_fast, "dead_relu").group(1).split(", ")
    assert all("_bn_" in layer for layer in dead), dead
    assert not alerted(too_fast, "nan")
    # batch norm removed: the same learning rate diverges to NaN, the first op that made it named
    assert alerted(no_bn, "nan") and alerted(no_bn, "exploding_gradient")
    assert re.search(r"op res\w+ \(res\w+/out_0, at Cell In\[\d+\], line \d+\)", no_bn)
    assert "no batch norm, lr 0.5: loss" in summary and "update_ratio" in summary and "first at step 0 on fc" in summary


def check_transformer_health(nb):
    out = text_output(nb)
    assert "Traceback" not in out and "failed to refresh" not in out
    assert widget_views(nb) == 3                                   # a HealthPanel per case shown
    data, healthy, too_fast, unscaled, summary = cell_texts(nb)
    assert "40 batches of 16 sequences of 16 tokens" in data
    alerted = lambda text, kind: re.search(rf"^alert {kind}: (.*) \(\d+ in all\)$", text, re.M)   # noqa: E731
    entropy = lambda text: [float(e) for e in re.findall(r"^entropy at the end, \S+: ([\d.]+)$", text, re.M)]  # noqa
    # healthy: learns, heads sharpen, and no alert (neither the warm-up's zero first step nor the query/key
    # projections' tiny gradients while their heads are uniform)
    assert "no alerts" in healthy and "alert " not in healthy
    first, last = map(float, re.search(r"loss: first ([\d.]+), mean of the last 5 ([\d.]+)", healthy).groups())
    assert last < first * 0.9
    assert len(entropy(healthy)) == 4 and all(0.3 < e < 0.98 for e in entropy(healthy))
    # no warm-up at lr 0.1: overwritten layers, a growing residual stream, a collapsed first layer, and the
    # vanishing gradient named on a query or key projection
    for kind in ("update_ratio", "residual_growth", "attention_collapsed", "vanishing_gradient"):
        assert alerted(too_fast, kind), kind
    assert alerted(too_fast, "attention_collapsed").group(1).startswith("bert-encoder-layer_0-attention-self")
    assert re.search(r"bert-encoder-layer_\d-attention-self-(query|key)", alerted(too_fast, "vanishing_gradient")
                     .group(1))
    assert "attends to a single key" in too_fast
    # the attention scale removed: the first layer collapses from step 0; with the scale it does not
    assert alerted(unscaled, "attention_collapsed").group(1) == "bert-encoder-layer_0-attention-self"
    assert max(entropy(unscaled)[:2]) < 0.1
    assert "with the scale: attention_collapsed 0 times" in unscaled
    assert re.search(r"attention_collapsed +\d+x, first at step 0 on bert-encoder-layer_0-attention-self", summary)
    assert re.search(r"healthy: .*\n    no alerts", summary)


CHECKS = {
    "01_train_digits.ipynb": check_train_digits,
    "02_watch_relu.ipynb": check_watch_relu,
    "03_watch_diff.ipynb": check_watch_diff,
    "04_watch_scope.ipynb": check_watch_scope,
    "05_debug_diverging.ipynb": check_debug_diverging,
    "06_summaries_dashboard.ipynb": check_summaries_dashboard,
    "07_checkpoints_finetuning.ipynb": check_checkpoints_finetuning,
    "08_multi_device.ipynb": check_multi_device,
    "09_network_health.ipynb": check_network_health,
    "10_cnn_health.ipynb": check_cnn_health,
    "11_transformer_health.ipynb": check_transformer_health,
}


def test_saved_notebooks_show_their_run_without_a_kernel():
    """The repository keeps the notebooks run top to bottom (``python notebooks/execute.py``), so a reader without a
    kernel (GitHub, nbviewer) sees what a run showed; each live widget's output carries its static fallback, an SVG
    rendering of its last state, and no widget state is saved (it would embed BokehJS)."""
    from nbconvert import HTMLExporter
    views_in = {}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = [cell for cell in nb.cells if cell.cell_type == "code"]
        assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), \
            f"{path.name} is not saved as run top to bottom: python notebooks/execute.py {path.name}"
        assert "widgets" not in nb.metadata, f"{path.name} saves widget state"
        outputs = [o for cell in code for o in cell.outputs]
        assert not [o for o in outputs if o.output_type == "error"], path.name
        views = [o for o in outputs if WIDGET in o.get("data", {})]
        for view in views:
            fallback = view.data["text/html"]
            assert "<svg" in fallback and "<script" not in fallback.lower() and "waiting for" not in fallback
        html, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)      # what nbviewer shows
        assert html.count("<svg") >= len(views) and "Error displaying widget" not in html
        views_in[path.name] = len(views)
    assert views_in["05_debug_diverging.ipynb"] == 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    monkeypatch.setenv("FLOWLAB_DEVICE", "auto")      # no GPU here: the choice that used to print a notice
    nb = execute(path)
    # JupyterLab draws stderr as a red error box: running without a GPU is normal and says nothing there
    stderr = [o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("name") == "stderr"]
    assert not any("flowlab: running" in text for text in stderr), stderr
    CHECKS[path.name](nb)
