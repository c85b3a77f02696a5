"""The plot layer: data shaping (``histogram_data``, ``tensor_summary``, ``Trend``) and Bokeh figure builders,
shared by the notebook widgets (``flowlab.widgets``) and the dashboard."""
from .data import SUMMARY_KEYS, Trend, histogram_data, tensor_summary
from .figures import (HEIGHT, WIDTH, histogram_figure, histogram_source, line_figure, stats_html, stats_table,
                      trend_figure, trend_source)

__all__ = ["SUMMARY_KEYS", "Trend", "histogram_data", "tensor_summary", "HEIGHT", "WIDTH", "histogram_figure",
           "histogram_source", "line_figure", "stats_html", "stats_table", "trend_figure", "trend_source"]
