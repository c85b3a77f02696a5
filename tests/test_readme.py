"""The Python examples of the README and of the user guide's first pages run as written, one after the other in one
namespace, as a reader pastes them."""
import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).parent.parent
README = ROOT / "README.md"
GUIDE = [ROOT / "docs" / "guide" / "job-functions.md", ROOT / "docs" / "guide" / "watching.md"]


def python_blocks(path):
    return re.findall(r"^```python\n(.*?)^```$", path.read_text(encoding="utf-8"), re.M | re.S)


def run(blocks, name):
    from IPython.display import display
    namespace = {"__name__": "readme", "display": display}      # the examples' display() is a notebook's
    for i, block in enumerate(blocks):
        exec(compile(block, f"{name} python block {i + 1}", "exec"), namespace)
    return namespace


def test_the_readme_example_trains_under_a_live_panel():
    blocks = python_blocks(README)
    assert len(blocks) == 1, "a new Python example in the README: check it runs here too"
    namespace = run(blocks, "README.md")
    loss, panel = namespace["loss"], namespace["panel"]
    assert loss.shape == (100,) and np.isfinite(loss).all() and loss.mean() < np.log(10)      # below chance after one epoch
    flow = namespace["flow"]
    flow.sync_default_session()
    panel.refresh()
    assert ("hidden_activation/out_0", "value") in panel._rows        # the watched layer has its row


def test_the_guide_examples_run_and_watch_scope_fills_the_dicts_the_reader_reads(capsys):
    blocks = [b for path in GUIDE for b in python_blocks(path)]
    assert len(blocks) == 2, "a new Python example in the guide's first pages: check it runs here too"
    namespace = run(blocks, "docs/guide")
    out = capsys.readouterr().out
    values, grads = namespace["values"], namespace["grads"]
    names = ["hidden-bias/out", "hidden-weight/out", "hidden_activation/out_0", "hidden_bias_add/out_0",
             "hidden_matmul/out_0"]
    assert sorted(values) == sorted(grads) == names, (sorted(values), sorted(grads))
    assert grads["hidden-weight/out"]["blob"].shape == values["hidden-weight/out"]["blob"].shape == (128, 64)
    assert f"{sorted(values)}\n(128, 64)\n" in out                # what the example prints last
    assert "(100, 10)" in out                                       # the watch_diff callback ran
