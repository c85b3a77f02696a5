"""The docs site (mkdocs.yml, docs/) builds with warnings as errors, without the network, and holds its pages: the
guide, the OneFlow table made from the code, the notebooks as stored, the performance page from
benchmarks/RESULTS.md, and an API reference in which every public name has a docstring."""
import html
import inspect
import importlib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE = ["job-functions", "watching", "live-panels", "health", "summaries", "dashboard", "remote-logdirs", "ofrecord",
         "multi-device", "checkpoints", "gpu"]
# The namespaces a user imports beside flowlab's own: each public one has a reference page.
EXTRA_MODULES = ["flowlab.widgets", "flowlab.dashboard"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter", "griffe"):
        pytest.importorskip(module)
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    print(f"docs built in {time.monotonic() - started:.1f} s")
    return out


def page(site, path):
    file = site / path / "index.html"
    assert file.exists(), f"no page {path}"
    return file.read_text(encoding="utf-8")


def text(markup):
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def test_site_has_its_pages(site):
    assert "See inside a network while it trains" in text(page(site, "."))
    start = text(page(site, "getting-started"))
    assert "pip install -e . && flowlab demo" in start and "pip install -e '.[test]' && pytest" in start
    assert "flow.watch(hidden, panel)" in start
    for name in GUIDE:
        assert len(text(page(site, f"guide/{name}"))) > 1000, name
    tensorboard = text(page(site, "coming-from-tensorboard"))
    assert "--samples-per-plugin" in tensorboard and "What the dashboard adds" in tensorboard
    assert "Host" in text(page(site, "security"))
    for image in ("dashboard.png", "watch-panel.png", "health-panel.png"):
        assert (site / "images" / image).stat().st_size < 400_000, image


def test_notebooks_are_pages_with_their_stored_outputs(site):
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert len(page(site, f"notebooks/{path.stem}")) > 10_000, path.name
    first = text(page(site, "notebooks/01_train_digits"))
    assert re.search(r"final test accuracy: 0\.9\d", first), "the stored output is shown"
    assert "Cell In[" in text(page(site, "notebooks/05_debug_diverging"))


def test_performance_page_is_benchmarks_results(site):
    shown = text(page(site, "performance"))
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    headings = re.findall(r"^##+ (.+)$", results, re.M)
    assert len(headings) > 10
    for heading in headings:            # every section of RESULTS.md, as it stands now
        plain = re.sub(r"[`*]", "", heading).strip()
        assert plain in shown, plain


def table_module():
    spec = importlib.util.spec_from_file_location("oneflow_table", ROOT / "docs" / "gen" / "oneflow_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_oneflow_table_is_made_from_the_code(site):
    shown = text(page(site, "coming-from-oneflow"))
    table = table_module()
    classes = table.classify()
    total = len(table.oneflow_names())
    assert total == sum(len(v) for v in classes.values()) > 400
    assert f"Of OneFlow v0.3.4's {total} public names, flowlab has " \
           f"{len(classes['supported']) + len(classes['differs'])}" in shown
    assert f"Missing ({len(classes['missing'])})" in shown and f"Differs on purpose ({len(classes['differs'])})" in shown
    differs = dict(classes["differs"])
    assert "Xavier-uniform" in differs["layers.dense"] and "flow.layers.dense" in shown
    assert "watch" not in classes["missing"] and "global_function" in classes["supported"]
    # a name flowlab has is never listed as missing, and one it lacks never as supported
    import flowlab
    assert all(table.resolve(n) is None for n in classes["missing"])
    assert hasattr(flowlab.layers, "dense") and "advanced.distribute_split" in classes["missing"]


def public_names():
    """``{module: [public name]}``: ``flowlab.__all__``, and for each public namespace (the modules in it, and
    ``EXTRA_MODULES``) its ``__all__``, or else the names it defines itself (not imported, not private)."""
    import inspect

    import flowlab
    names = {"flowlab": list(flowlab.__all__)}
    modules = [getattr(flowlab, n) for n in flowlab.__all__ if inspect.ismodule(getattr(flowlab, n))] + \
        [importlib.import_module(m) for m in EXTRA_MODULES]
    for module_name in dict.fromkeys(m.__name__ for m in modules):      # flowlab.optimizer is flowlab.optim
        module = importlib.import_module(module_name)
        if hasattr(module, "__all__"):
            names[module_name] = list(module.__all__)
        else:
            names[module_name] = [n for n, obj in vars(module).items() if not n.startswith("_")
                                  and not inspect.ismodule(obj)
                                  and getattr(obj, "__module__", module_name) == module_name]
    return names


def test_every_public_name_has_a_docstring_and_a_place_in_the_reference(site):
    import griffe
    loaded = griffe.load("flowlab", search_paths=[str(ROOT)], allow_inspection=True)
    reference = "".join(p.read_text(encoding="utf-8") for p in (site / "reference").rglob("index.html"))
    # flowlab.dashboard is documented from its folder, dashboard/ (docs/reference/dashboard.md says why)
    anchors = {re.sub(r"^dashboard(?=\.|$)", "flowlab.dashboard", a)
               for a in re.findall(r'id="((?:flowlab|dashboard)(?:\.[^"]+)?)"', reference)}
    undocumented, unlisted = [], []
    for module_name, names in public_names().items():
        module = importlib.import_module(module_name)
        assert (module.__doc__ or "").strip(), f"{module_name} has no docstring"
        for name in names:
            path = f"{module_name}.{name}"
            obj = getattr(module, name)
            if callable(obj) or isinstance(obj, type) or inspect.ismodule(obj):
                doc = getattr(obj, "__doc__", None)
            else:               # a value (a dtype): its docstring is the string after its assignment (griffe)
                try:
                    member = loaded[path.removeprefix("flowlab.")]
                    doc = member.docstring.value if member.docstring else None
                except (KeyError, griffe.AliasResolutionError):
                    doc = None
            if not (doc or "").strip():
                undocumented.append(path)
            if path not in anchors:
                unlisted.append(path)
    assert undocumented == [], f"public names without a docstring: {undocumented}"
    assert unlisted == [], f"public names missing from the API reference: {unlisted}"
