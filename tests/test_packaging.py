"""pyproject lists every package (dashboard/ is mapped to flowlab.dashboard, so nothing is discovered)."""
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_package_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "flowlab").rglob("__init__.py")}
    found |= {"flowlab.dashboard" + "".join("." + part for part in p.parent.relative_to(ROOT / "dashboard").parts)
              for p in (ROOT / "dashboard").rglob("__init__.py")}
    assert listed == found


def test_dashboard_imports_as_part_of_flowlab():
    import flowlab.dashboard.store as store
    assert pathlib.Path(store.__file__).resolve() == ROOT / "dashboard" / "store.py"


def test_package_data_covers_the_widgets_front_end():
    """A non-editable install must carry live.js (the widgets' JavaScript) and the proto descriptors."""
    import fnmatch
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package, suffix in (("flowlab.widgets", ".js"), ("flowlab.summary.proto", ".pb")):
        folder = ROOT.joinpath(*package.split("."))
        files = [p.name for p in folder.iterdir() if p.suffix == suffix]
        assert files and all(any(fnmatch.fnmatch(f, pattern) for pattern in data[package]) for f in files), package
