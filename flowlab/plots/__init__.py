"""The plot layer: data shaping (``histogram_data``, ``tensor_summary``, ``Trend``), Bokeh figure builders and a
static HTML rendering of them (``static.to_html``), shared by the notebook widgets (``flowlab.widgets``) and the
dashboard: histograms are drawn by ``histogram_bars`` and series over steps by ``draw_bands`` in both."""
from .data import SUMMARY_KEYS, Trend, finite_extent, histogram_data, sticky_range, tensor_summary
from .figures import (HEIGHT, LIVE_HEIGHT, STATS_ROWS, WIDTH, bar_columns, draw_bands, fit_histogram, fit_range,
                      fit_trend, heading, histogram_bars, histogram_columns, histogram_source, histogram_view, is_spiky,
                      stats_columns, stats_source, stats_view, status_sources, status_view, trend_columns, trend_figure,
                      trend_source)

__all__ = ["SUMMARY_KEYS", "Trend", "finite_extent", "histogram_data", "sticky_range", "tensor_summary", "HEIGHT",
           "LIVE_HEIGHT", "STATS_ROWS", "WIDTH", "bar_columns", "draw_bands", "fit_histogram", "fit_range", "fit_trend",
           "heading", "histogram_bars", "histogram_columns", "histogram_source", "histogram_view", "is_spiky",
           "stats_columns", "stats_source", "stats_view", "status_sources", "status_view", "trend_columns",
           "trend_figure", "trend_source"]
