"""The static HTML rendering of the plot layer's Bokeh layouts (``flowlab.plots.static``), checked by parsing the SVG it
writes: layouts built by flowlab's own builders, geometry measured against the frame (the clip path's rectangle) and
the axes' tick labels."""
import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from bokeh.layouts import column, row
from bokeh.models import Button, ColumnDataSource, DatetimeAxis, Range1d

from flowlab.plots.data import Trend, histogram_data
from flowlab.plots.figures import (ALARM, BAND, VALUE, fit_histogram, fit_trend, heading, histogram_columns,
                                   histogram_source, histogram_view, plain_figure, stats_columns, stats_source, stats_view, status_sources,
                                   status_view, trend_columns, trend_figure, trend_source)
from flowlab.plots.static import data_range, to_html
from flowlab.watching import TensorStats

SVG = "{http://www.w3.org/2000/svg}"
CHAR_PX = 0.5        # a digit is at least half an em wide in any sans-serif font


# ------------------------------------------------------------------------------------------------ reading the output

def svgs(text):
    """Every ``<svg>`` of an output, parsed."""
    return [ET.fromstring(m) for m in re.findall(r"<svg\b.*?</svg>", text, re.S)]


def path_points(d):
    """The subpaths of an SVG path's ``d`` (the commands ``to_html`` writes: M, l, H, V, Z) as lists of absolute
    points."""
    tokens = re.findall(r"[MlHVZ]|-?(?:\d+(?:\.\d*)?|\.\d+)", d)
    assert "".join(tokens).replace(" ", "") == re.sub(r"\s", "", d), f"unexpected path syntax in {d[:80]!r}"
    subpaths, command, numbers, x, y = [], None, [], 0.0, 0.0
    for token in tokens + ["END"]:
        if token[0] not in "MlHVZE":
            numbers.append(float(token))
            if command in "Ml" and len(numbers) == 2:
                if command == "M":
                    x, y = numbers
                    subpaths.append([])
                    command = "L"
                else:
                    x, y = x + numbers[0], y + numbers[1]
                subpaths[-1].append((x, y))
                numbers = []
            elif command == "L" and len(numbers) == 2:     # pairs after M's first are absolute, as in SVG
                x, y = numbers
                subpaths[-1].append((x, y))
                numbers = []
            elif command in "HV":
                x, y = (numbers[0], y) if command == "H" else (x, numbers[0])
                subpaths[-1].append((x, y))
                numbers = []
            continue
        assert not numbers, f"dangling numbers in {d[:80]!r}"
        command = token
    return subpaths


def frame(svg):
    rect = svg.find(f"{SVG}defs/{SVG}clipPath/{SVG}rect")
    x, y, w, h = (float(rect.get(k)) for k in ("x", "y", "width", "height"))
    return x, y, x + w, y + h


def glyph_paths(svg):
    """The glyph renderers' paths: the children of the group clipped to the frame."""
    groups = [g for g in svg.iter(f"{SVG}g") if g.get("clip-path")]
    assert len(groups) == 1
    clip_id = svg.find(f"{SVG}defs/{SVG}clipPath").get("id")
    assert groups[0].get("clip-path") == f"url(#{clip_id})"
    return list(groups[0])


def paths_of(svg, **attrs):
    return [p for p in glyph_paths(svg) if all(p.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def tick_labels(svg, axis):
    """``[(x, y, text)]`` of the x (``"x"``) or y axis's tick labels."""
    anchor = {"x": "middle", "y": "end"}[axis]
    groups = [g for g in svg.iter(f"{SVG}g") if g.get("text-anchor") == anchor]
    assert len(groups) == 1
    return [(float(t.get("x")), float(t.get("y")), t.text) for t in groups[0]]


def label_value(text):
    text = text.replace("−", "-")
    scale = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(text[-1], 1.0)
    return float(text[:-1] if scale != 1.0 else text) * scale


def texts(svg):
    return [t.text for t in svg.iter(f"{SVG}text")]


def view_width(svg):
    return float(svg.get("viewBox").split()[2])


# ----------------------------------------------------------------------------------------------------------- layouts

def histogram(values, log=False):
    source = histogram_source()
    source.data = histogram_columns(histogram_data(np.asarray(values, np.float64)))
    view, toggle = histogram_view(source, log=log)
    fit_histogram(None, view.children, source.data)         # what the live widget sets with the data
    return column(toggle, view, sizing_mode="stretch_width"), source


def stats(value):
    if math.isnan(value):
        return TensorStats((4,), math.nan, math.nan, math.nan, math.nan, 4, 0)
    return TensorStats((4,), value - 1.0, value + 1.0, value, 0.5, 0, 0)


def trend(values, label="value"):
    t = Trend(max_points=500)
    for step, value in enumerate(values):
        t.add(step, stats(value))
    source = trend_source()
    source.data = trend_columns(t.columns())
    fig = trend_figure(source, label)
    fit_trend(None, fig, source.data)
    return fig, source


def one_svg(layout, width=900):
    out = to_html(layout, width)
    (svg,) = svgs(out)
    return svg, out


# --------------------------------------------------------------------------------------------------------- histograms

def test_linear_histogram_draws_one_bar_per_nonempty_bin_with_heights_proportional_to_counts():
    # 30 bins over [0, 3]: counts 21, 80 and 51 in three of them, the 27 others empty
    values = np.concatenate([np.full(20, 0.05), np.full(80, 1.55), np.full(50, 2.95), [0.0, 3.0]])
    layout, source = histogram(values)
    svg, _ = one_svg(layout)
    top = np.asarray(source.data["top"])
    (bars,) = paths_of(svg, fill=VALUE)
    rects = path_points(bars.get("d"))
    assert len(rects) == np.count_nonzero(top) == 3
    x0, y0, x1, y1 = frame(svg)
    heights = np.array([max(p[1] for p in r) - min(p[1] for p in r) for r in rects])
    bottoms = np.array([max(p[1] for p in r) for r in rects])
    np.testing.assert_allclose(bottoms, y1, atol=0.11)          # y_range.start = 0 sits on the frame's bottom
    per_count = heights / top[top > 0]
    np.testing.assert_allclose(per_count, per_count.mean(), rtol=0.005)
    lefts = sorted(min(p[0] for p in r) for r in rects)
    assert x0 < lefts[0] and lefts == sorted(lefts)
    # the tallest bar reaches 1/1.05 of the frame: DataRange1d's padding is 5% above the data, none below start=0
    assert heights.max() == pytest.approx((y1 - y0) / 1.05, abs=0.2)
    assert data_range(layout.children[1].children[0], "y") == pytest.approx((0.0, 80 * 1.05))


def test_log_histogram_ticks_are_powers_of_ten_and_1000_is_three_decades_above_1():
    values = np.concatenate([[0.0], np.full(10, 1.0), np.full(1000, 2.0), [3.0]])   # counts 1, 10, 1000, 1
    layout, source = histogram(values, log=True)
    svg, _ = one_svg(layout)
    assert "count (log)" in texts(svg)
    labels = tick_labels(svg, "y")
    decades = [math.log10(label_value(text)) for _, _, text in labels]
    assert len(decades) >= 3 and all(d == round(d) for d in decades)
    ys = sorted((y for _, y, _ in labels), reverse=True)
    per_decade = ys[0] - ys[1]
    np.testing.assert_allclose(np.diff(ys), -per_decade, atol=0.15)       # evenly spaced decades
    (bars,) = paths_of(svg, fill=VALUE)
    tops = {}
    for r in path_points(bars.get("d")):
        left = min(p[0] for p in r)
        tops[left] = min(p[1] for p in r)
    assert len(tops) == np.count_nonzero(np.asarray(source.data["top"]))   # empty bins (NaN on a log axis): no bar
    counts = dict(zip(sorted(tops), np.asarray(source.data["top"])[np.asarray(source.data["top"]) > 0]))
    top_of = {counts[left]: tops[left] for left in tops}
    assert top_of[1] - top_of[1000] == pytest.approx(3 * per_decade, abs=0.3)
    assert top_of[1] - top_of[10] == pytest.approx(per_decade, abs=0.3)


@pytest.mark.parametrize("log", [False, True])
def test_only_the_visible_one_of_the_linear_log_pair_is_drawn(log):
    layout, _ = histogram(np.arange(100.0), log=log)
    svg, out = one_svg(layout)
    assert ("count (log)" if log else "count") in texts(svg)
    assert ("count" if log else "count (log)") not in texts(svg)
    assert ("☑ log count" if log else "☐ log count") in out
    linear, logarithmic = layout.children[1].children
    linear.visible = logarithmic.visible = False
    assert svgs(to_html(layout)) == []


# ------------------------------------------------------------------------------------------------------------ trends

def test_line_breaks_at_a_nan_and_the_band_bridges_it_as_bokehjs_fills_it():
    values = [float(v) for v in np.linspace(0.0, 1.0, 40)]
    values[20] = math.nan
    fig, source = trend(values)
    svg, _ = one_svg(fig)
    (line,) = paths_of(svg, stroke=BAND)
    pieces = path_points(line.get("d"))
    assert [len(p) for p in pieces] == [20, 19]
    # BokehJS 3.9 fills a VArea with canvas lineTo calls, which skip non-finite points: one polygon, the NaN bucket's
    # point left out of both its edges
    for area in paths_of(svg, fill_opacity="0.35") + paths_of(svg, fill_opacity="0.3"):
        if area.get("fill") == ALARM:
            continue
        (polygon,) = path_points(area.get("d"))
        assert area.get("d").endswith("Z") and len(polygon) == 2 * 39
    nan_x = [float(x) for x in np.asarray(source.data["step"])][20]
    x0, _, x1, _ = frame(svg)
    start, end = data_range(fig, "x")
    nan_px = x0 + (nan_x - start) / (end - start) * (x1 - x0)
    assert all(abs(x - nan_px) > 1 for piece in pieces for x, _ in piece)


def test_line_on_a_log_axis_leaves_out_non_positive_values():
    fig = plain_figure(y_axis_type="log")
    fig.line(x=[0, 1, 2, 3, 4, 5], y=[1.0, 10.0, 0.0, 100.0, 1000.0, -5.0])
    svg, _ = one_svg(fig)
    (line,) = glyph_paths(svg)
    assert [len(p) for p in path_points(line.get("d"))] == [2, 2]
    # the range spans the positive values only: 1…1000, three decades padded by 10% in log space
    assert data_range(fig, "y") == pytest.approx((10 ** -0.15, 10 ** 3.15))


def test_a_spike_reaches_the_top_of_the_frame():
    values = [1.0 + 0.01 * (i % 3) for i in range(300)]
    values[150] = 1e6
    fig, _ = trend(values)
    svg, _ = one_svg(fig)
    _, y0, _, y1 = frame(svg)
    (line,) = paths_of(svg, stroke=BAND)
    points = [p for piece in path_points(line.get("d")) for p in piece]
    highest = min(y for _, y in points)
    # the envelope (max = 1e6 + 1) is one unit higher than the mean; padding is 5% of the span above the data
    assert y0 < highest <= y0 + 0.05 * (y1 - y0)
    assert sorted(y for _, y in points)[1] >= y1 - 0.05 * (y1 - y0)     # every other point down at the bottom


def test_nan_marks_span_the_full_frame_height_at_their_steps():
    values = [math.sin(i / 10) for i in range(200)]
    for i in (50, 51, 120):
        values[i] = math.nan
    fig, source = trend(values)
    svg, _ = one_svg(fig)
    x0, y0, x1, y1 = frame(svg)
    (marks,) = paths_of(svg, fill=ALARM)
    rects = path_points(marks.get("d"))
    assert len(rects) == 3
    start, end = data_range(fig, "x")

    def px(x):
        return x0 + (x - start) / (end - start) * (x1 - x0)

    for rect, step in zip(rects, (50, 51, 120)):
        xs, ys = [p[0] for p in rect], [p[1] for p in rect]
        assert min(ys) == pytest.approx(y0, abs=0.11) and max(ys) == pytest.approx(y1, abs=0.11)
        assert min(xs) == pytest.approx(px(step), abs=0.11) and max(xs) == pytest.approx(px(step + 1), abs=0.11)
    # the marks live on their own 0…1 range: the value axis still follows the data (sin: -1…1, padded)
    lo, hi = data_range(fig, "y")
    assert lo == pytest.approx(-2.0 - 0.2, abs=0.05) and hi == pytest.approx(2.0 + 0.2, abs=0.05)


# --------------------------------------------------------------------------------------------------- safety, sizes

def test_strings_from_models_are_escaped_and_nothing_active_is_written():
    evil = "<script>alert('x')</script> & co"
    fig = plain_figure(title=evil, x_axis_label=evil, y_axis_label=evil)
    fig.line(x=[0, 1], y=[0, 1])
    layout, _ = histogram(np.arange(10.0))
    layout.children[0].label = evil
    out = to_html(column(fig, layout, stats_table_of(np.arange(4.0), step=evil), heading("<b>run</b>")))
    assert "<script" not in out.lower() and "<style" not in out.lower()
    assert not re.search(r"\b(?:href|src)\s*=|javascript:|\bon\w+\s*=", out, re.I)
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in out
    assert texts(svgs(out)[0]).count(evil) == 3          # title and both axis labels, escaped and read back whole
    assert evil in texts(svgs(out)[-1])                   # canvas text of a stats table, escaped likewise
    assert "<b>run</b>" in out                            # a Div's trusted HTML goes in as is


def test_empty_sources_draw_axes_only():
    layout, _ = histogram([])
    fig, _ = trend([])
    out = to_html(row(layout, fig))
    hist_svg, trend_svg = svgs(out)
    for svg in (hist_svg, trend_svg):
        assert glyph_paths(svg) == []
        assert len(tick_labels(svg, "x")) >= 2 and len(tick_labels(svg, "y")) >= 2
    assert data_range(fig, "x") == (0.0, 1.0) and data_range(fig, "y") == (0.0, 1.0)
    assert [label_value(t) for _, _, t in tick_labels(trend_svg, "x")] == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1])


def figure_with(glyph, **kwargs):
    fig = plain_figure()
    getattr(fig, glyph)(x=[1.0], y=[2.0], **kwargs)
    return fig


@pytest.mark.parametrize("make, name", [
    (lambda: figure_with("scatter"), "Scatter"),
    (lambda: figure_with("circle", radius=1.0), "Circle"),
    (lambda: figure_with("step"), "Step"),
    (lambda: Button(label="go"), "Button"),
])
def test_unsupported_models_raise_type_error_naming_their_class(make, name):
    with pytest.raises(TypeError, match=name):
        to_html(row(heading("ok"), make()))


def stats_table_of(values, step=3):
    source = stats_source()
    source.data = stats_columns(np.asarray(values), step)
    return stats_view(source)


def test_stats_table_text_is_drawn_row_by_row_with_nonfinite_counts_in_red():
    svg = svgs(to_html(stats_table_of(np.array([1.0, 2.0, np.nan, np.nan, np.inf]), step=41)))[0]
    drawn = [(t.get("x"), float(t.get("y")), t.text, t.get("fill")) for t in svg.iter(f"{SVG}text")]
    labels = [text for x, _, text, _ in drawn if float(x) < 20]
    values = {label: (text, fill) for label, (_, _, text, fill) in zip(labels, [d for d in drawn if float(d[0]) > 20])}
    assert labels == ["step", "shape", "min", "max", "mean", "std", "NaN", "Inf", "hist"]
    assert [y for _, y, _, _ in drawn[:9]] == sorted(y for _, y, _, _ in drawn[:9])    # top to bottom, in order
    assert values["step"][0] == "41" and values["max"][0] == "2" and values["mean"][0] == "1.5"
    assert values["NaN"] == ("2", ALARM) and values["Inf"] == ("1", ALARM) and values["min"][1] != ALARM


def test_status_line_and_progress_bar():
    text, done = status_sources()
    text.data = {"text": ["step 9 · 10/40 (25%) | loss <1>"]}
    done.data = {"left": [0.0], "right": [0.25], "bottom": [0.12], "top": [0.36]}
    svg = svgs(to_html(status_view(text, done), width=800))[0]
    assert texts(svg) == ["step 9 · 10/40 (25%) | loss <1>"]
    track, bar = [[x for x, _ in path_points(p.get("d"))[0]] for p in glyph_paths(svg) if p.tag == f"{SVG}path"]
    assert (max(bar) - min(bar)) / (max(track) - min(track)) == pytest.approx(0.25, abs=0.01)


def test_unsupported_axes_and_ranges_raise_type_error():
    fig = plain_figure()
    fig.line(x=[0, 1], y=[0, 1])
    fig.below = [DatetimeAxis()]
    with pytest.raises(TypeError, match="DatetimeAxis"):
        to_html(fig)
    fig = plain_figure(x_range=["a", "b"])
    fig.line(x=[0, 1], y=[0, 1])
    with pytest.raises(TypeError, match="Categorical|Factor"):
        to_html(fig)


def test_stretch_width_figures_share_a_row_and_a_fixed_width_div_keeps_its_width():
    a, _ = trend([1.0, 2.0, 3.0])
    b, _ = trend([3.0, 2.0, 1.0])
    out = to_html(row(a, b, stats_table_of(np.arange(3.0))), width=900)
    assert [view_width(s) for s in svgs(out)] == [355.0, 355.0, 190.0]     # (900 - 190) / 2, and the fixed table
    assert out.count("flex:1 1 0") == 2
    fixed = plain_figure(width=300)
    fixed.line(x=[0, 1], y=[0, 1])
    out = to_html(row(fixed, b), width=900)
    assert [view_width(s) for s in svgs(out)] == [300.0, 600.0]


def panel(rows=6, points=500, seed=0):
    rng = np.random.default_rng(seed)
    made = []
    for i in range(rows):
        hist, _ = histogram(rng.standard_normal(2000) * 10.0 ** (i - 3), log=i % 2 == 1)
        fig, _ = trend(list(rng.standard_normal(points) * 10.0 ** (i - 3)), label=f"row {i}")
        made.append(row(hist, fig, stats_table_of(rng.standard_normal(10))))
    return column(*made)


def test_a_six_row_panel_of_500_point_trends_stays_small():
    out = to_html(panel())
    assert len(svgs(out)) == 18
    assert len(out.encode()) < 200_000


def test_tick_labels_do_not_overlap():
    narrow = plain_figure(width=160, height=120)
    narrow.line(x=[0.0, 123456.0], y=[1e-5, 3e-5])
    svgs_ = svgs(to_html(column(panel(rows=3, points=100), narrow)))
    checked = 0
    for svg in svgs_:
        axes = [g for g in svg.iter(f"{SVG}g") if g.get("text-anchor") == "middle"]
        if not axes:
            continue                                      # a stats table: text, no axes
        font = float(axes[0].get("font-size"))
        labels = sorted(tick_labels(svg, "x"))
        assert len(labels) >= 2
        for (xa, _, a), (xb, _, b) in zip(labels, labels[1:]):
            assert xb - xa >= (len(a) + len(b)) / 2 * CHAR_PX * font
            checked += 1
        ys = sorted(y for _, y, _ in tick_labels(svg, "y"))
        assert all(y2 - y1 >= font for y1, y2 in zip(ys, ys[1:]))
    assert checked >= 10
    x_labels = [t for _, _, t in tick_labels(svgs_[-1], "x")]
    y_labels = [t for _, _, t in tick_labels(svgs_[-1], "y")]
    assert all(t == "0" or t.endswith("k") for t in x_labels)
    assert all("e-05" in t for t in y_labels)
    y_values = [label_value(t) for t in y_labels]
    assert len(set(y_labels)) == len(y_labels) and np.allclose(np.diff(y_values), y_values[1] - y_values[0])


def test_extra_range_from_range1d_and_explicit_data_range_ends():
    fig = plain_figure()
    fig.line(x=[0.0, 10.0], y=[5.0, 15.0])
    fig.y_range.start = 0.0
    assert data_range(fig, "y") == pytest.approx((0.0, 15.75))          # padding only above: (15 - 0) * 0.05
    assert data_range(fig, "x") == pytest.approx((-0.5, 10.5))
    fig.x_range = Range1d(2.0, 4.0)
    assert data_range(fig, "x") == (2.0, 4.0)
    svg, _ = one_svg(fig)
    x0, y0, x1, y1 = frame(svg)
    ((first, *rest),) = path_points(glyph_paths(svg)[0].get("d"))
    assert first[0] < x0 and rest[-1][0] > x1      # drawn beyond the frame, clipped by it


def test_shared_x_range_is_one_range_for_both_figures():
    a = plain_figure()
    a.line(x=[0.0, 10.0], y=[0.0, 1.0])
    b = plain_figure(x_range=a.x_range)
    b.line(x=[5.0, 30.0], y=[0.0, 1.0])
    out = to_html(column(a, b))
    ticks = [[t for _, _, t in tick_labels(svg, "x")] for svg in svgs(out)]
    assert ticks[0] == ticks[1] and label_value(ticks[0][-1]) >= 30
    source = ColumnDataSource({"x": [0.0, 1.0], "y": [0.0, None]})
    c = plain_figure()
    c.line(x="x", y="y", source=source)
    svg, _ = one_svg(c)
    assert glyph_paths(svg) == []          # a None is a missing value: no segment, nothing drawn


def test_an_auto_range_takes_every_renderer_of_the_figure_as_bokehjs_does():
    # BokehJS 3 auto-ranges a DataRange1d without ``renderers`` over all of the figure's glyphs, those drawn on an
    # extra range too (bokeh/bokeh#13302); trend_figure names its renderers to keep the NaN marks out.
    fig = plain_figure()
    fig.line(x=[0.0, 1.0], y=[100.0, 200.0])
    fig.extra_y_ranges = {"marks": Range1d(0, 1)}
    fig.quad(left=[0.0], right=[1.0], bottom=[0.0], top=[1.0], y_range_name="marks")
    assert data_range(fig, "y") == pytest.approx((-10.0, 210.0))
    assert data_range(fig, "y", "marks") == (0.0, 1.0)
    fig.y_range.renderers = [fig.renderers[0]]
    assert data_range(fig, "y") == pytest.approx((95.0, 205.0))


def test_log_and_colour_bar_ticks_and_their_labels_are_the_same_in_bokehjs_and_in_the_static_copy(chromium):
    """Over a decade or two a log axis reads "0.05, 0.1, 0.2, 0.5, 1" (BokehJS's LogTicker put "1" and "0.5" alone
    there, and 1…9 crowded at the top of a colour bar), over many decades every k-th power of ten; a colour bar on a
    linear scale about five 1-2-5 steps; each label is short ("700", "10k", "1e-5", not "7.0e+2"). ``figures``'
    BokehJS code and ``plots.static``'s rule give the same ticks and labels."""
    from flowlab.plots.figures import _SCALE_TICKS_JS, _VALUE_LABELS_JS, scale_ticker, value_labels
    from flowlab.plots.static import linear_ticks, log_ticks, value_label, value_texts
    ranges = [(0.5, 10.0, True), (0.035, 1.2, True), (0.1, 2e6, True), (1e-8, 1e3, True), (0.02, 30.0, True),
              (2.6, 250.0, True), (30.0, 50.0, True), (1.0, 1000.0, True), (3e-7, 4e-6, True), (7.0, 7.5, True),
              (0.0, 1.0, False), (0.0, 12.0, False), (-3.0, 17.0, False), (1.1e-5, 1.3e-5, False),
              (0.0, 2.5e6, False)]
    values = [0, 0.3, 0.1 + 0.2, 35, 700, 1000, 1234.5, 1e4, 2.5e4, 999_999.9999999, 1e6, 2e9, 1e-5, 2.5e-7,
              1.125e-5, 0.05, 0.001, 0.00123456789, -0.5, -2e4, 5e15]
    scales = [[1e4, 1e8, 1e12, 1e16], [1e12, 1e13, 1e14, 1e15], [1e-4, 1e-2, 1.0, 100.0], [0.01, 1.0, 100.0, 1e4],
              [0.0, 5e14, 1e15, 1.5e15], [1e-3, 1e-2, 0.1], [0.05, 0.1, 0.2, 0.5, 1.0]]
    page = chromium.new_page()
    try:
        live_ticks = page.evaluate(f"""(ranges) => ranges.map(([start, end, log]) =>
            (function (cb_data, log) {{ {_SCALE_TICKS_JS} }})({{start, end}}, log))""", ranges)
        live_labels = page.evaluate(f"""(values) => values.map((tick) =>
            (function (tick, index, ticks) {{ {_VALUE_LABELS_JS} }})(tick, 0, [tick]))""", values)
        # the ticks of one scale get one style: e-notation for all when one needs it (a colour bar read "1T" beside
        # "1e+16")
        live_scales = page.evaluate(f"""(scales) => scales.map((ticks) => ticks.map((tick, index) =>
            (function (tick, index, ticks) {{ {_VALUE_LABELS_JS} }})(tick, index, ticks)))""", scales)
    finally:
        page.close()
    for (lo, hi, log), live in zip(ranges, live_ticks):
        ticks, _ = log_ticks(lo, hi, 5) if log else linear_ticks(lo, hi, 5)
        assert live == pytest.approx(list(ticks), rel=1e-12, abs=1e-300), (lo, hi, log)
    assert live_labels == [value_label(v) for v in values]
    assert live_scales == [value_texts(ticks) for ticks in scales]
    assert live_scales[:5] == [["1e+4", "1e+8", "1e+12", "1e+16"], ["1e+12", "1e+13", "1e+14", "1e+15"],
                               ["1e-4", "1e-2", "1e+0", "1e+2"], ["0.01", "1", "100", "10k"],
                               ["0", "5e+14", "1e+15", "1.5e+15"]]
    assert live_scales[5:] == [["0.001", "0.01", "0.1"], ["0.05", "0.1", "0.2", "0.5", "1"]]
    expected = {0: [0.5, 1, 2, 5, 10], 1: [0.05, 0.1, 0.2, 0.5, 1], 2: [1, 100, 1e4, 1e6], 3: [1e-6, 1e-3, 1, 1e3],
                5: [5, 10, 50, 100], 6: [30, 35, 40, 45, 50], 10: [0, 0.2, 0.4, 0.6, 0.8, 1]}
    for i, ticks in expected.items():
        assert live_ticks[i] == pytest.approx(ticks), ranges[i]
    assert live_labels == ["0", "0.3", "0.3", "35", "700", "1000", "1234.5", "10k", "25k", "1M", "1M", "2G", "1e-5",
                           "2.5e-7", "1.125e-5", "0.05", "0.001", "0.00123457", "-0.5", "-20k", "5e+15"]
    # a figure with them is drawn by the static copy with the same rule
    fig = plain_figure(y_axis_type="log")
    fig.line(x=[0.0, 1.0, 2.0], y=[1.2, 0.3, 0.035])
    fig.yaxis.ticker, fig.yaxis.formatter = scale_ticker(), value_labels()
    svg, = svgs(to_html(fig))
    y_labels = [t for _, _, t in sorted(tick_labels(svg, "y"), key=lambda e: e[1])]
    assert set(y_labels) <= {"0.05", "0.1", "0.2", "0.5", "1"} and {"0.05", "1"} <= set(y_labels)


def test_compact_labels_are_the_same_in_bokehjs_and_in_the_static_copy(chromium):
    """A step axis past 100,000 reads "0, 20k, 40k" live (``figures.compact_ticks``, not BokehJS's "2.000e+4"), a
    trend's values past 1e15 "1e+18" (not "1.000e+18"), and the same in a saved notebook's copy (``plots.static``),
    which draws a formatter tagged so as its own labels."""
    from flowlab.plots.figures import _COMPACT_TICKS_JS, compact_ticks
    from flowlab.plots.static import tick_texts
    cases = [[0, 20_000, 40_000, 60_000, 80_000, 100_000], [0, 200_000, 400_000, 600_000, 800_000, 1_000_000],
             [0, 5, 10, 15, 20], [0, 2.5, 5, 7.5], [-0.5, 0, 0.5, 1], [100_000, 150_000, 200_000], [0, 0.001, 0.002],
             [1_000_000, 1_000_500, 1_001_000], [0, 2e9, 4e9],
             # past T and below 0.001: e-notation with the fewest digits (BokehJS wrote "3.000e+18", "0.000e+0")
             [0, 1e18, 2e18, 3e18], [2.5e15, 5e15, 7.5e15], [0, 2e-5, 4e-5, 6e-5], [3e-8, 3.2e-8, 3.4e-8],
             [-1e-4, 0, 1e-4], [1e-7, 1.5e-7]]
    page = chromium.new_page()
    try:
        live = page.evaluate(f"""(cases) => cases.map((ticks) => ticks.map((tick, index) =>
            (function (tick, index, ticks) {{ {_COMPACT_TICKS_JS} }})(tick, index, ticks)))""", cases)
    finally:
        page.close()
    assert live == [tick_texts(ticks, ticks[1] - ticks[0]) for ticks in cases]
    assert live[0] == ["0", "20k", "40k", "60k", "80k", "100k"] and live[1][-1] == "1M"
    assert live[9] == ["0", "1e+18", "2e+18", "3e+18"] and live[11] == ["0", "2e-05", "4e-05", "6e-05"]
    fig = trend_figure(trend_source(), y_label="loss")
    assert fig.xaxis[0].formatter.tags == compact_ticks().tags == fig.yaxis[0].formatter.tags
    svg, = svgs(to_html(fig))                     # drawn, not refused as an unknown formatter
    assert svg is not None
