"""Colours that read on the dashboard's light and dark backgrounds and tell runs apart: sRGB ↔ CIELAB, WCAG
contrast, and the run palette (``RUN_COLOURS``).

A run's colour is the same in both colour schemes (the server assigns it before it knows which the browser shows),
so it must read on white and on the dark scheme's plot background alike. WCAG's 3 : 1 for graphics against both
leaves a band of mid lightness, L* ≈ 44…62 (CIELAB), for every run colour. ``readable_palette`` moves each colour of a
source palette into that band (its lightness clamped, its chroma reduced only as far as sRGB's gamut demands, so
hues stay the source's), then orders them so that the first ones are as far apart as the band allows: greedily, each
colour taken when it is at least ΔE 20 (CIE76: Euclidean distance in CIELAB) from every one taken before, then 10,
then 5, then the rest.
"""
from __future__ import annotations

import functools

import numpy as np

LIGHT_BACKGROUND = "#ffffff"        # a card's plot in the light scheme
DARK_BACKGROUND = "#1b1f24"         # ... and in the dark scheme (dashboard.app.DARK's --bk-background-fill-color)
MIN_CONTRAST = 3.0                  # WCAG 2.1 SC 1.4.11, graphical objects
ALARM = "#d62728"                   # NaN/Inf and alerts, on every plot: no run or category may look like it
DISTINCT = (20.0, 10.0, 5.0, 0.0)   # the ΔE (CIE76) steps of the palette's order

# sRGB (linear) to CIE XYZ, D65, and D65's white point: IEC 61966-2-1.
_XYZ = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
_WHITE = np.array([0.95047, 1.0, 1.08883])
_EPS = (6 / 29) ** 3


def linear_rgb(colours):
    """``#rrggbb`` colours as linear-light sRGB rows in 0…1."""
    for c in colours:
        if not (isinstance(c, str) and len(c) == 7 and c[0] == "#"):
            raise ValueError(f"colours must be '#rrggbb' strings, got {c!r}")
    rgb = np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in colours], np.float64).reshape(-1, 3) / 255
    return np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)


def hex_colours(linear):
    """Linear-light sRGB rows (clipped to 0…1) as ``#rrggbb``."""
    lin = np.clip(np.asarray(linear, np.float64).reshape(-1, 3), 0.0, 1.0)
    srgb = np.where(lin <= 0.0031308, 12.92 * lin, 1.055 * lin ** (1 / 2.4) - 0.055)
    return ["#%02x%02x%02x" % tuple(v) for v in np.round(srgb * 255).astype(int)]


def luminance(colours):
    """WCAG relative luminance (0 black … 1 white) of ``#rrggbb`` colours."""
    return linear_rgb(colours) @ _XYZ[1]


def contrast(colours, background):
    """WCAG contrast ratio (1…21) of each of ``colours`` against ``background``."""
    y, bg = luminance(colours), luminance([background])[0]
    return (np.maximum(y, bg) + 0.05) / (np.minimum(y, bg) + 0.05)


def _lab_of_linear(lin):
    f = (lin @ _XYZ.T) / _WHITE
    f = np.where(f > _EPS, np.cbrt(f), f / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


def _linear_of_lab(lab):
    fy = (lab[:, 0] + 16) / 116
    f = np.stack([fy + lab[:, 1] / 500, fy, fy - lab[:, 2] / 200], axis=1)
    xyz = np.where(f > 6 / 29, f ** 3, 3 * (6 / 29) ** 2 * (f - 4 / 29)) * _WHITE
    return xyz @ np.linalg.inv(_XYZ).T


def cielab(colours):
    """CIELAB (D65) coordinates of ``#rrggbb`` colours; distances there are CIE76 ΔE."""
    return _lab_of_linear(linear_rgb(colours))


def _lightness_band(backgrounds, ratio):
    """The L* range whose colours have ``ratio`` contrast with every one of ``backgrounds`` (some above, some
    below: a light and a dark one)."""
    ys = luminance(backgrounds)
    darker = [y for y in ys if y < 0.5]
    lighter = [y for y in ys if y >= 0.5]
    y_low = max((ratio * (y + 0.05) - 0.05 for y in darker), default=0.0)
    y_high = min(((y + 0.05) / ratio - 0.05 for y in lighter), default=1.0)
    if y_low > y_high:
        raise ValueError(f"no colour has {ratio}:1 contrast with every one of {list(backgrounds)}")
    return (116 * np.cbrt([y_low, y_high]) - 16).tolist()


def readable_palette(colours, backgrounds=(LIGHT_BACKGROUND, DARK_BACKGROUND), ratio=MIN_CONTRAST,
                     distinct=DISTINCT, margin=1.5, reserved=(ALARM,)):
    """``colours`` moved into the lightness band where each has ``ratio`` contrast with every one of
    ``backgrounds`` (``margin`` L* inside it, for the rounding to 8 bits), and ordered by distinctness (see the
    module doc). Duplicates (after the move) appear once; colours closer than ``distinct[0]`` to a ``reserved`` one
    are left out, so that a run's line never reads as a NaN mark."""
    low, high = _lightness_band(backgrounds, ratio)
    lab = cielab(colours)
    lab[:, 0] = np.clip(lab[:, 0], low + margin, high - margin)

    def scaled(scale):                                     # the colours with their chroma times ``scale``
        return _linear_of_lab(np.column_stack([lab[:, :1], lab[:, 1:] * scale[:, None]]))

    def inside(scale):
        lin = scaled(scale)
        return ((lin >= -1e-9) & (lin <= 1 + 1e-9)).all(axis=1)

    # the largest chroma scale (of the source's) that stays inside sRGB, by bisection per colour
    lo, hi = np.zeros(len(lab)), np.ones(len(lab))
    fits = inside(hi)
    for _ in range(40):
        mid = (lo + hi) / 2
        ok = inside(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    moved = list(dict.fromkeys(hex_colours(scaled(np.where(fits, 1.0, lo)))))
    lab = cielab(moved)
    if reserved:
        keep = np.linalg.norm(lab[:, None] - cielab(list(reserved))[None], axis=2).min(axis=1) >= distinct[0]
        moved, lab = [c for c, k in zip(moved, keep) if k], lab[keep]
    distance = np.linalg.norm(lab[:, None] - lab[None], axis=2)
    order, nearest = [], np.full(len(moved), np.inf)      # each colour's distance to the nearest one taken
    for least in distinct:
        for i in range(len(moved)):
            if nearest[i] >= least:
                order.append(i)
                nearest = np.minimum(nearest, distance[i])
                nearest[order] = -np.inf                   # (taken)
    return tuple(moved[i] for i in order)


@functools.cache
def run_colours():
    """The runs' (and every category's) palette: colorcet's Glasbey palette (which starts with Category10's ten) made
    readable on both schemes' backgrounds, without ALARM's reds, and ordered by distinctness (``readable_palette``):
    the first 37 are at least ΔE 20 apart.
    Computed once, when first asked (some tens of milliseconds)."""
    from colorcet import palette
    return readable_palette(palette["glasbey_category10"])
