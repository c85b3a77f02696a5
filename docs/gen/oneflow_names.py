"""Write ``docs/gen/oneflow-0.3.4-names.txt``: every public name of OneFlow v0.3.4's Python API, one a line.

OneFlow 0.x publishes a name with the ``oneflow_export("a.b", ...)`` decorator (or call); this reads every
``oneflow/python/**/*.py`` of the ``v0.3.4`` tag from a git clone of OneFlow and collects the string arguments of
those calls with ``ast``. It was run once; the list is kept so that the docs build needs neither the clone nor the
network:

    python docs/gen/oneflow_names.py /path/to/oneflow/.git
"""
import ast
import subprocess
import sys
from pathlib import Path

TAG = "v0.3.4"
OUT = Path(__file__).with_name("oneflow-0.3.4-names.txt")


def exported_names(source):
    """The names ``oneflow_export(...)`` calls in ``source`` publish (not those of ``oneflow_export`` itself)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "oneflow_export":
            names.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return names


def main(git_dir):
    git = ["git", "--git-dir", git_dir]
    files = subprocess.run(git + ["ls-tree", "-r", "--name-only", TAG, "oneflow/python"], check=True,
                           capture_output=True, text=True).stdout.split()
    names = set()
    for path in files:
        if path.endswith(".py") and "/test/" not in path:
            source = subprocess.run(git + ["show", f"{TAG}:{path}"], check=True, capture_output=True, text=True).stdout
            names |= exported_names(source)
    header = (f"# OneFlow {TAG}'s public Python names (oneflow_export), one a line; made by docs/gen/oneflow_names.py\n"
              "# from OneFlow's sources. The docs build compares flowlab's names with these (docs/gen/oneflow_table.py).\n")
    OUT.write_text(header + "".join(f"{n}\n" for n in sorted(names)), encoding="utf-8")
    print(f"{len(names)} names -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".git")
