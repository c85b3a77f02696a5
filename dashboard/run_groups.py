"""Run groups: runs a session draws together, as their mean and a band (what TensorBoard users have asked for
since 2017, tensorboard#376), chosen once beside the run list for every tab that plots series.

Runs are grouped by a name pattern (an RE2 regex: a run's group is its first capture, or its whole match; runs it
does not match stay on their own) or by an hparam's value (``lr=0.1``; a run without that hparam stays on its own).
A run's hparams are those its sessions logged (``hparams`` summaries, flowlab's ``add_hparams`` or TensorBoard's
plugin data): the run's own, or for a run without any, those of a child run ``<run>/<name>`` as tensorboardX's
``add_hparams`` writes them. The band is ± one standard deviation or min to max over the group's runs, step by step
(``flowlab.plots.data.group_band``).
"""
from __future__ import annotations

import html
import posixpath

from bokeh.layouts import column
from bokeh.models import Div, RadioButtonGroup, Select, TextInput

from .filters import FilterError, compile_filter

NOTHING, NAME = "", "name"
BANDS = ("std", "range")            # the band's kinds, in the order of the buttons


class RunGroups:
    """One session's grouping: ``groups(runs)`` gives ``{label: [run, ...]}`` of those of ``runs`` that fall in a
    group (in the order given), ``band`` the band's kind ("std" or "range"). ``on_change(callback)``: called when the
    grouping changes. ``update()`` (on the session's IOLoop) learns the hparams the store read since the last call.
    """

    def __init__(self, store, width=250):
        self.store = store
        self.by = Select(title="Group runs by", options=[(NOTHING, "nothing"), (NAME, "name pattern")],
                         value=NOTHING, width=width, name="group-by")
        self.pattern = TextInput(placeholder="regex, e.g. lr=[^,]+", width=width, visible=False,
                                 name="group-pattern")
        self.band_choice = RadioButtonGroup(labels=["± std", "min–max"], active=0, width=width, visible=False,
                                            name="band")
        self.message = Div(text="", width=width, visible=False, styles={"font-size": "12px", "color": "#c00"})
        self._hparams: dict[str, dict] = {}         # run -> {name: value}, from its sessions
        self._seen: dict[tuple, tuple] = {}          # hparams series key -> (epoch, length) read
        self._regex = None
        self._listeners = []
        self.by.on_change("value", lambda attr, old, new: self._choose())
        self.pattern.on_change("value", lambda attr, old, new: self._choose())
        self.band_choice.on_change("active", lambda attr, old, new: self._changed())

    def layout(self):
        return column(self.by, self.pattern, self.band_choice, self.message, name="run-groups")

    def url_state(self):
        return [("groupby", self.by, "value"), ("group", self.pattern, "value"), ("band", self.band_choice, "active")]

    def on_change(self, callback):
        self._listeners.append(callback)

    # ------------------------------------------------------------------------------------------------ reading
    @property
    def band(self) -> str:
        return BANDS[self.band_choice.active or 0]

    @property
    def active(self) -> bool:
        return self.by.value == NAME and self._regex is not None or self.by.value.startswith("hparam:")

    def group_of(self, run) -> str | None:
        """The label of ``run``'s group, or None when it stays on its own."""
        if self.by.value == NAME:
            match = self._regex.search(run) if self._regex is not None else None
            if match is None:
                return None
            return match.group(1) if match.groups() and match.group(1) is not None else match.group(0)
        if self.by.value.startswith("hparam:"):
            name = self.by.value[len("hparam:"):]
            hparams = self.hparams_of(run)
            return f"{name}={_shown(hparams[name])}" if name in hparams else None
        return None

    def groups(self, runs) -> dict[str, list]:
        out: dict[str, list] = {}
        if self.active:
            for run in runs:
                label = self.group_of(run)
                if label is not None:
                    out.setdefault(label, []).append(run)
        return out

    def hparams_of(self, run) -> dict:
        own = self._hparams.get(run)
        if own:
            return own
        children = [r for r in self._hparams if posixpath.dirname(r) == run]    # tensorboardX: <run>/<time>
        return self._hparams[children[0]] if len(children) == 1 else {}

    # ------------------------------------------------------------------------------------------------ updating
    def update(self):
        """Read the hparams the store found since the last call; offer each hparam name as a grouping."""
        found = False
        for series in self.store.series("hparams"):
            epoch, length = self._seen.get(series.key, (None, 0))
            d = self.store.read(series, epoch, length)
            self._seen[series.key] = (d.epoch, (0 if d.reset else length) + len(d.steps))
            for value in d.values:
                hparams = value.get("session_start_info", {}).get("hparams") if isinstance(value, dict) else None
                if hparams:
                    self._hparams.setdefault(series.run, {}).update(hparams)
                    found = True
        if found:
            names = sorted({name for hparams in self._hparams.values() for name in hparams})
            options = [(NOTHING, "nothing"), (NAME, "name pattern")] + [(f"hparam:{n}", f"hparam {n}")
                                                                         for n in names]
            if options != list(map(tuple, self.by.options)):
                self.by.options = options
            if self.by.value.startswith("hparam:"):     # a grouping chosen (from the URL) before its hparam arrived
                self._changed()

    def _choose(self):
        by = self.by.value
        self.pattern.visible = by == NAME
        error = ""
        if by == NAME:
            try:
                self._regex = compile_filter(self.pattern.value) if self.pattern.value else None
            except FilterError as e:            # keep the last good pattern; say what is wrong with this one
                error = f"Invalid group regex {e.pattern!r}: {e.reason}"
        self.message.text, self.message.visible = html.escape(error), bool(error)
        self.band_choice.visible = by != NOTHING
        self._changed()

    def _changed(self):
        for callback in self._listeners:
            callback()


def _shown(value):
    """An hparam value as a group label shows it: numbers compactly (0.1, not 0.10000000149011612)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


class NoGroups:
    """The grouping of a view used on its own (tests, benchmarks): no groups."""
    band = "std"
    active = False

    @staticmethod
    def groups(runs):
        return {}

    @staticmethod
    def group_of(run):
        return None
