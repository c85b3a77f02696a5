"""The status line above the tabs: what the store has read of the logdir, or why there is nothing to show yet."""
from __future__ import annotations

import html
import time

from bokeh.models import Div


def status_html(status: dict) -> str:
    """One line of HTML for ``Store.status()``; every value from outside (paths, errors) is escaped."""
    logdir = html.escape(status["logdir"])
    if not status["exists"]:
        return (f'<span style="color:#b45309">No logdir at <code>{logdir}</code> yet: waiting for it to appear. '
                f'Runs show up here without a page reload once a writer logs there.</span>')
    if status["files"] == 0:
        return (f'<span style="color:#b45309">No event files under <code>{logdir}</code> yet (looking for file names '
                f'containing <code>tfevents</code>); waiting for a run to log.</span>')
    last = status["last_update"]
    parts = [f'<code>{logdir}</code>', f'{status["runs"]} run{"s" * (status["runs"] != 1)}',
             f'{status["files"]} file{"s" * (status["files"] != 1)}', f'{status["records_read"]:,} records read',
             f'{status["records_skipped"]:,} skipped (bad CRC)',
             "last update " + (time.strftime("%H:%M:%S", time.localtime(last)) if last else "never")]
    if status["records_skipped"]:
        parts[4] = f'<span style="color:#c00">{parts[4]}</span>'
    if status.get("health_skipped"):            # health reports that do not fit their tag's layers
        parts.insert(5, f'<span style="color:#c00">{status["health_skipped"]:,} health reports skipped '
                        f'(layers unlike the tag\'s first)</span>')
    if status.get("rereads") or status.get("files_followed"):    # files that changed under the tailer
        changes = "\n".join(f'{c["path"]}: {c["reason"]}' for c in status.get("file_changes", ()))
        counts = [f'{status["rereads"]:,} re-read' if status.get("rereads") else "",
                  f'{status["files_followed"]:,} followed' if status.get("files_followed") else ""]
        parts.insert(5, f'<span title="{html.escape(changes)}">files changed under the reader: '
                        f'{", ".join(c for c in counts if c)} (each step shown once)</span>')
    problems = [f"{path}: {why}" for path, why in status["errors"].items()]
    if status["store_error"]:
        problems.insert(0, status["store_error"])
    if problems:
        parts.append(f'<span style="color:#c00" title="{html.escape(chr(10).join(problems))}">'
                     f'{len(problems)} unreadable: {html.escape(problems[0])}</span>')
    return " · ".join(parts)


class StatusLine:
    """The line, redrawn at most every ``every`` seconds while only its counts move: a Div's new text makes BokehJS
    lay out the whole page, and during training the counts change at every poll. A change of state (logdir found,
    first files, new runs or files, errors) shows at once."""

    def __init__(self, store, every=2.0):
        self.store, self.every = store, every
        self.div = Div(text="", sizing_mode="stretch_width", name="status",
                       styles={"font-size": "13px", "padding": "4px 2px", "color": "#333"})
        self._state, self._shown_at = None, 0.0

    def layout(self):
        return self.div

    def update(self):
        try:
            status = self.store.status()
            text = status_html(status)
        except RuntimeError:        # the poll thread changed the tailer's tables mid-copy: try again next tick
            return
        state = (status["exists"], status["runs"], status["files"], bool(status["records_skipped"]),
                 status.get("rereads"), status.get("files_followed"),
                 bool(status.get("health_skipped")), len(status["errors"]), status["store_error"])
        now = time.monotonic()
        if text != self.div.text and (state != self._state or now - self._shown_at >= self.every):
            self.div.text = text
            self._state, self._shown_at = state, now
