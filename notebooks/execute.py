#!/usr/bin/env python
"""Run the notebooks here top to bottom in a real Jupyter kernel and save them with their outputs, as the repository
keeps them: a reader on GitHub or nbviewer, who has no kernel, sees what a run showed. Each live widget's output
carries a static HTML rendering of its last state beside the live view, so the panels show there as they ended.

Widget state is not saved: it would embed BokehJS (~0.5 MB) in every notebook, and the static rendering already
serves readers without a kernel. The notebooks run on NumPy (``FLOWLAB_DEVICE=cpu``), as CI runs them.

    python notebooks/execute.py                         # every notebook
    python notebooks/execute.py 05_debug_diverging.ipynb
"""
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def execute(path, save=True):
    """Execute the notebook at ``path`` in a fresh kernel; save it in place with its outputs; return it."""
    os.environ["FLOWLAB_DEVICE"] = "cpu"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)
    if save:
        nbformat.write(nb, path)
    return nb


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(p.name for p in HERE.glob("*.ipynb"))
    for name in names:
        execute(HERE / name)
        print(f"saved {name} with its outputs")
