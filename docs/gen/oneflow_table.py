"""The "coming from OneFlow 0.x" table, made from the code at each docs build so that it cannot go stale.

Every name of OneFlow v0.3.4's public API (``oneflow-0.3.4-names.txt``, made once by ``oneflow_names.py``) is looked
up in ``flowlab`` as ``flow.<name>``:

- **supported**: flowlab has it;
- **differs**: flowlab has it and its docstring has a paragraph starting ``Differs from OneFlow:``, which the table
  quotes (the difference is written where the code is, so it changes with it);
- **missing**: flowlab has no such name.

    python docs/gen/oneflow_table.py        # prints the Markdown
"""
import importlib
import inspect
import re
from collections import defaultdict
from pathlib import Path

NAMES = Path(__file__).with_name("oneflow-0.3.4-names.txt")
DIFFERS = re.compile(r"^Differs from OneFlow:\s*(.+?)(?:\n\s*\n|\Z)", re.M | re.S)


def oneflow_names():
    return [line.strip() for line in NAMES.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


def resolve(name):
    """``flow.<name>`` in flowlab, or None. A namespace flowlab does not import eagerly is imported."""
    import flowlab
    obj, path = flowlab, "flowlab"
    for part in name.split("."):
        path += "." + part
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(path)
        except ImportError:
            return None
    return obj


def difference(obj):
    """The ``Differs from OneFlow:`` paragraph of ``obj``'s docstring, on one line, or None."""
    doc = inspect.getdoc(obj) if callable(obj) or inspect.ismodule(obj) else None
    found = DIFFERS.search(doc or "")
    return " ".join(found.group(1).split()) if found else None


def classify():
    """``{"supported": [name], "differs": [(name, how)], "missing": [name]}``, names sorted."""
    out = {"supported": [], "differs": [], "missing": []}
    for name in oneflow_names():
        obj = resolve(name)
        if obj is None:
            out["missing"].append(name)
        elif (how := difference(obj)) is not None:
            out["differs"].append((name, how))
        else:
            out["supported"].append(name)
    return out


def _namespace(name):
    return "flow." + name.rsplit(".", 1)[0] if "." in name else "flow"


def _grouped(names):
    groups = defaultdict(list)
    for name in names:
        groups[_namespace(name)].append(name)
    return sorted(groups.items(), key=lambda item: (item[0] != "flow", item[0]))


def markdown():
    c = classify()
    total = sum(len(v) for v in c.values())
    lines = [f"Of OneFlow v0.3.4's **{total}** public names, flowlab has **{len(c['supported']) + len(c['differs'])}**: "
             f"{len(c['supported'])} as OneFlow has them and {len(c['differs'])} that differ on purpose; "
             f"**{len(c['missing'])}** it lacks. (Generated from flowlab's code at each build of these pages.)", "",
             f"### Differs on purpose ({len(c['differs'])})", "", "| OneFlow name | how flowlab differs |", "|---|---|"]
    lines += [f"| `flow.{name}` | {how.replace('|', '&#124;')} |" for name, how in c["differs"]]
    lines += ["", f"### Supported ({len(c['supported'])})", "", "| namespace | names |", "|---|---|"]
    lines += [f"| `{ns}` | " + ", ".join(f"`{n.rsplit('.', 1)[-1]}`" for n in names) + " |"
              for ns, names in _grouped(c["supported"])]
    lines += ["", f"### Missing ({len(c['missing'])})", "", "| namespace | names |", "|---|---|"]
    lines += [f"| `{ns}` | " + ", ".join(f"`{n.rsplit('.', 1)[-1]}`" for n in names) + " |"
              for ns, names in _grouped(c["missing"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown())
