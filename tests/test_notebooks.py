"""Every notebook under notebooks/ runs top to bottom in a real Jupyter kernel (nbclient)."""
import pathlib
import re

import nbformat
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


CHECKS = {"01_train_digits.ipynb": check_train_digits}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    monkeypatch.setenv("FLOWLAB_DEVICE", "cpu")
    CHECKS[path.name](execute(path))
