"""The README's Python examples run as written, one after the other in one namespace, as a reader pastes them."""
import pathlib
import re

README = pathlib.Path(__file__).parent.parent / "README.md"


def python_blocks():
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), re.M | re.S)


def test_the_readme_examples_run_and_watch_scope_fills_the_dicts_the_reader_reads(capsys):
    from IPython.display import display
    blocks = python_blocks()
    assert len(blocks) == 2, "a new Python example in the README: check it runs here too"
    namespace = {"__name__": "readme", "display": display}      # the watch example's display() is a notebook's
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
    out = capsys.readouterr().out
    values, grads = namespace["values"], namespace["grads"]
    names = ["hidden-bias/out", "hidden-weight/out", "hidden_activation/out_0", "hidden_bias_add/out_0",
             "hidden_matmul/out_0"]
    assert sorted(values) == sorted(grads) == names, (sorted(values), sorted(grads))
    assert grads["hidden-weight/out"]["blob"].shape == values["hidden-weight/out"]["blob"].shape == (128, 64)
    assert f"{sorted(values)}\n(128, 64)\n" in out                # what the example prints last
    assert "(100, 10)" in out                                       # the watch_diff callback ran
