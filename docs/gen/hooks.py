"""MkDocs hooks (``mkdocs.yml``: ``hooks``): what the docs take from the repository at each build, so no page copies
what can change.

- The notebooks under ``notebooks/`` become pages ``notebooks/<name>.ipynb`` (mkdocs-jupyter renders them as
  stored, with their outputs; ``python notebooks/execute.py`` re-runs them, and CI runs them again).
- ``{{ oneflow_table }}`` on a page becomes the OneFlow 0.x name table (``oneflow_table.py``, made from the code).
- ``{{ benchmark_results }}`` becomes ``benchmarks/RESULTS.md`` (its title dropped, headings one level down).
"""
import importlib.util
import re
import sys
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def _table_module():
    spec = importlib.util.spec_from_file_location("_flowlab_oneflow_table", Path(__file__).with_name("oneflow_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@event_priority(100)          # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files, config):
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        # src_dir is the repository: the page notebooks/<name>.ipynb is read from where the notebook is kept
        files.append(File(f"notebooks/{path.name}", src_dir=str(ROOT), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files


def _results():
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    text = re.sub(r"\A# [^\n]*\n", "", text)                     # the page has its own title
    return re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.M)


def on_page_markdown(markdown, page, config, files):
    if "{{ oneflow_table }}" in markdown:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        markdown = markdown.replace("{{ oneflow_table }}", _table_module().markdown())
    if "{{ benchmark_results }}" in markdown:
        markdown = markdown.replace("{{ benchmark_results }}", _results())
    return markdown
