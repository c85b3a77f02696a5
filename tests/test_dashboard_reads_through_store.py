"""No module under dashboard/ reads a file or walks a directory itself: the logdir is read by
``flowlab.summary.provider.LogdirProvider`` alone, and the views see it through the store, its cache (so every tab
works the same on a local path and an s3:// URL, and each file is read once for every session).

An AST scan, with import aliases resolved (``import numpy as np``, ``from os import walk``...), for calls that open
or list files; the scan is itself tested on snippets that do each of those."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

DASHBOARD = Path(__file__).resolve().parent.parent / "dashboard"

# Calls (fully qualified, after resolving import aliases) that read, stat or list files.
FORBIDDEN = {
    "open", "io.open", "codecs.open", "os.open", "os.fdopen", "os.walk", "os.fwalk", "os.listdir", "os.scandir",
    "os.stat", "os.lstat", "os.path.exists", "os.path.lexists", "os.path.isfile", "os.path.isdir",
    "os.path.getmtime", "os.path.getsize", "glob.glob", "glob.iglob", "pathlib.Path", "pathlib.PurePath",
    "fsspec.open", "fsspec.open_files", "fsspec.filesystem", "fsspec.core.url_to_fs", "fsspec.core.open",
    "numpy.load", "numpy.loadtxt", "numpy.genfromtxt", "numpy.fromfile", "numpy.memmap", "pickle.load",
    "shutil.copy", "shutil.copyfile", "shutil.copytree", "linecache.getline", "tarfile.open", "zipfile.ZipFile",
    "flowlab.summary.projector.read_projector", "flowlab.summary.reader.read_scalars",
    "flowlab.summary.tailer.LogdirTailer", "flowlab.summary.logdir_files.open_logdir",
}
# Methods that read or list files whatever they are called on (a Path, an fsspec filesystem...).
FORBIDDEN_METHODS = {"read_text", "read_bytes", "iterdir", "rglob", "glob", "walk", "scandir", "listdir", "cat_file",
                     "cat", "open", "loadtxt"}
# Modules whose only use would be reading files.
FORBIDDEN_IMPORTS = {"glob", "pathlib", "fsspec", "shutil", "linecache", "tarfile", "zipfile", "s3fs"}


def _dotted(node, aliases):
    """The qualified name a call's function stands for (``np.load`` -> ``numpy.load``), or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _in_memory(call):
    """``Image.open(io.BytesIO(data))``: opening bytes already read (through the store), not a file; and
    ``super().open()``, a websocket handler's open (the base class's), which names no file."""
    receiver = call.func.value
    if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
        return True
    return bool(call.args) and isinstance(call.args[0], ast.Call) and \
        (_dotted(call.args[0].func, {}) or "").endswith("BytesIO")


def offending(source, name="<snippet>"):
    """``line: what`` for each place in ``source`` that reads or lists files itself."""
    tree = ast.parse(source, name)
    aliases = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name.split(".")[0] in FORBIDDEN_IMPORTS:
                    found.append(f"{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if node.module.split(".")[0] in FORBIDDEN_IMPORTS:
                found.append(f"{node.lineno}: from {node.module} import ...")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        if name in FORBIDDEN or name and name.replace("flowlab.dashboard.", "dashboard.") in FORBIDDEN:
            found.append(f"{node.lineno}: {name}()")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN_METHODS and not _in_memory(node):
            found.append(f"{node.lineno}: .{node.func.attr}()")
    return found


@pytest.mark.parametrize("snippet", [
    "open('x')",
    "with open(path, 'rb') as f: pass",
    "import os\nos.walk(logdir)",
    "import os\nos.listdir('.')",
    "import os\nos.scandir('.')",
    "import os\nos.stat(p)",
    "import os.path\nos.path.exists(p)",
    "from os import walk\nwalk('.')",
    "import glob",
    "from glob import glob",
    "from pathlib import Path",
    "p.read_text()",
    "p.read_bytes()",
    "p.open()",
    "fs.cat_file(key)",
    "import fsspec",
    "import numpy as np\nnp.load(path)",
    "import numpy\nnumpy.loadtxt(path)",
    "from numpy import load\nload(path)",
    "from flowlab.summary.projector import read_projector\nread_projector(d)",
    "from flowlab.summary.tailer import LogdirTailer\nLogdirTailer(d)",
    "from flowlab.summary import reader\nreader.read_scalars(d)",
])
def test_the_scan_finds_each_way_of_reading_files(snippet):
    assert offending(snippet), snippet


def test_the_scan_lets_in_memory_images_and_plain_code_pass():
    assert offending("import io\nfrom PIL import Image\nImage.open(io.BytesIO(data))") == []
    assert offending("import json\njson.dumps(x)\nstore.projectors()\nstore.sprite(run, e)") == []


def test_no_dashboard_module_reads_files_itself():
    files = sorted(DASHBOARD.rglob("*.py"))
    assert len(files) > 20 and any(f.name == "projector.py" for f in files)     # the scan sees the views
    found = {str(f.relative_to(DASHBOARD.parent)): hits for f in files
             if (hits := offending(f.read_text(encoding="utf-8"), str(f)))}
    assert found == {}, f"modules under dashboard/ that read files themselves (read through the store): {found}"
