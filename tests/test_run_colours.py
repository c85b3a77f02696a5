"""Run colours read on both colour schemes' backgrounds (WCAG contrast ≥ 3 : 1, the bar for graphics) and stay
apart (CIE76 ΔE ≥ 20 between any two of the first 20 runs; ΔE 2 is a just-noticeable difference). Measured with
this file's own WCAG and CIELAB formulas, against the backgrounds the dashboard's stylesheet sets."""
import numpy as np
import pytest

from dashboard_page import luminance
from flowlab.dashboard import app
from flowlab.dashboard.runs import palette_colour
from flowlab.plots import colours
from test_dashboard_app import cielab


def wcag_contrast(a, b):
    """WCAG 2.1's contrast ratio of two ``#rrggbb`` colours."""
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


# The plots' and the page's backgrounds in each scheme (light: Bokeh's white; dark: the page's stylesheet).
BACKGROUNDS = {"light plot": "#ffffff", "dark plot": app.DARK["--bk-background-fill-color"],
               "dark page": app.DARK["--flowlab-paper"]}


def test_the_palette_knows_the_dashboards_backgrounds():
    assert colours.LIGHT_BACKGROUND == BACKGROUNDS["light plot"]
    assert colours.DARK_BACKGROUND == BACKGROUNDS["dark plot"]


@pytest.mark.parametrize("where", sorted(BACKGROUNDS))
def test_every_run_colour_has_three_to_one_contrast(where):
    background = BACKGROUNDS[where]
    runs = [palette_colour(i) for i in range(len(colours.run_colours()))]
    worst = min(runs, key=lambda c: wcag_contrast(c, background))
    assert wcag_contrast(worst, background) >= 3.0, (where, worst, wcag_contrast(worst, background))
    np.testing.assert_allclose(colours.contrast(runs, background), [wcag_contrast(c, background) for c in runs],
                               rtol=1e-3)


def test_twenty_runs_are_each_at_least_delta_e_20_from_every_other():
    lab = cielab([palette_colour(i) for i in range(20)])
    distance = np.linalg.norm(lab[:, None] - lab[None], axis=2)
    distance[np.diag_indices(20)] = np.inf
    assert distance.min() >= 20.0, distance.min()
    np.testing.assert_allclose(colours.cielab([palette_colour(i) for i in range(20)]), lab, atol=0.05)
    assert len(set(colours.run_colours())) == len(colours.run_colours()) > 200   # then the palette repeats
    assert palette_colour(len(colours.run_colours())) == palette_colour(0)


def test_category10_hues_but_red_stay_first_moved_only_in_lightness():
    """The first nine are Category10's hues but its red, which is the NaN marks' (ALARM): blue, orange, green,
    purple, brown, pink, grey, olive, cyan. Those already readable stay exactly as they were."""
    first = [palette_colour(i) for i in range(9)]
    assert first[0] == "#1f77b3" and first[3] == "#9367bc" and first[6] == "#7e7e7e"
    source = cielab(["#1f77b3", "#ff7e0e", "#2ba02b", "#9367bc", "#8c564b", "#e277c1", "#7e7e7e",
                     "#bcbc21", "#16bdcf"])
    moved = cielab(first)
    hue = lambda lab: np.degrees(np.arctan2(lab[:, 2], lab[:, 1]))
    chromatic = np.hypot(source[:, 1], source[:, 2]) > 5
    assert np.abs(((hue(moved) - hue(source) + 180) % 360 - 180)[chromatic]).max() < 6


def test_readable_palette_checks_what_it_is_given():
    with pytest.raises(ValueError, match="no colour has 3.0:1 contrast"):
        colours.readable_palette(["#ff0000"], backgrounds=("#ffffff", "#808080", "#000000"))
    with pytest.raises(ValueError, match=r"'#rrggbb' strings, got 'red'"):
        colours.readable_palette(["red"])
    # any palette comes out readable on the backgrounds asked for
    rng = np.random.default_rng(0)
    made = colours.readable_palette(["#%06x" % v for v in rng.integers(0, 2 ** 24, 50)])
    assert min(wcag_contrast(c, b) for c in made for b in ("#ffffff", colours.DARK_BACKGROUND)) >= 3.0


def test_no_run_or_category_colour_reads_as_the_nan_red():
    """NaN/Inf ticks and alerts are ALARM red on every plot: a run's line, a graph category's box or a projector class
    in that red would read as an alarm (the Graph tab drew activations in Category10's red beside its NaN legend)."""
    from flowlab.dashboard.views.graph import CATEGORY_COLORS
    from flowlab.plots.colours import ALARM, cielab, run_colours
    palette = run_colours()
    apart = np.linalg.norm(cielab(list(palette)) - cielab([ALARM]), axis=1)
    assert apart.min() >= 20
    assert set(CATEGORY_COLORS.values()) <= set(palette)
    with_red = colours.readable_palette(["#1f77b4", "#d62728", "#2ca02c"], reserved=())
    assert len(with_red) == 3 and len(colours.readable_palette(["#1f77b4", "#d62728", "#2ca02c"])) == 2
