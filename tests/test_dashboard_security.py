"""The dashboard is safe to run: user-typed regexes cannot stall the server (RE2), ..."""
import re
import time

import pytest
from bokeh.document import Document

from flowlab.dashboard import app
from flowlab.dashboard.filters import MAX_PATTERN_CHARS, FilterError, compile_filter
from flowlab.dashboard.store import Store
from flowlab.dashboard.views.hparams import matches
from flowlab.summary import SummaryWriter

# (.+)+# against a name with no '#' backtracks 2^n ways in Python's re: 27 characters cost ~30 s there.
EVIL = "(.+)+#"
NAME = "a" * 27
# Python's re needs ~2^(n-1) steps; at 20 characters it already takes ~0.1-0.3 s on this machine, so a bound far
# below that shows the linear engine, not luck.
BOUND_S = 0.05


def _backtracking_is_slow(n=20):
    """Python's re on EVIL at n characters, timed, to show the bound below is one the old engine blows."""
    t = time.perf_counter()
    re.compile(EVIL).search("a" * n)
    return time.perf_counter() - t


# ----------------------------------------------------------------------------------------------------- ReDoS

def test_compile_filter_is_linear_time_on_a_catastrophic_pattern():
    assert _backtracking_is_slow() > BOUND_S        # the engine we replaced blows the bound at 20 characters
    regex = compile_filter(EVIL)
    t = time.perf_counter()
    for _ in range(100):
        assert regex.search(NAME) is None
    assert regex.search(NAME + "#") is not None
    elapsed = time.perf_counter() - t
    assert elapsed < BOUND_S, f"100 RE2 searches of {EVIL!r} over 27 characters took {elapsed:.3f} s"


@pytest.mark.parametrize("pattern, said", [("(unclosed", "missing )"), (r"(a)\1", "invalid escape"),
                                           ("(?<=a)b", "invalid perl operator")])
def test_compile_filter_names_the_pattern_and_the_reason(pattern, said):
    with pytest.raises(FilterError) as caught:
        compile_filter(pattern)
    assert repr(pattern) in str(caught.value) and said in caught.value.reason
    assert "RE2" in caught.value.reason


def test_compile_filter_caps_the_length_and_honours_case_and_literal():
    with pytest.raises(FilterError, match=f"at most {MAX_PATTERN_CHARS}"):
        compile_filter("a" * (MAX_PATTERN_CHARS + 1))
    assert compile_filter("LOSS", ignore_case=True).search("train/loss")
    assert not compile_filter("LOSS").search("train/loss")
    assert compile_filter("[a", literal=True).search("x[a]") and compile_filter("").search("anything")


def _runs_logdir(path, names):
    for name in names:
        with SummaryWriter(path / name) as w:
            w.add_scalar("loss", 1.0, 0)
            w.add_hparams({"lr": 0.1}, {"hparam/acc": 0.5}, run_name=".")
    return path


def test_scalars_and_hparams_filters_do_not_stall_on_a_catastrophic_pattern(tmp_path):
    logdir = _runs_logdir(tmp_path, [NAME, "b" * 27])
    store = Store(logdir)
    store.poll()
    views = app.build_document(Document(), store)
    scalars = views["scalars"]
    t = time.perf_counter()
    scalars.run_filter.value = EVIL
    scalars.tag_filter.value = EVIL
    elapsed = time.perf_counter() - t
    assert elapsed < 2.0, f"typing {EVIL!r} into the Scalars filters took {elapsed:.2f} s"
    assert scalars.message.text == "" and not scalars.cards["loss"].layout.visible
    scalars.run_filter.value = r"(a)\1"                      # a backreference: RE2 refuses, the view says why
    assert "Invalid runs regex" in scalars.message.text and "RE2" in scalars.message.text

    t = time.perf_counter()
    assert not matches(EVIL, NAME, {"lr": "a" * 27})
    assert time.perf_counter() - t < BOUND_S
    assert matches("[a", "x[a", {}) and not matches("[a", "xa", {})   # not a regex: plain text, as before
    assert not matches("a" * (MAX_PATTERN_CHARS + 1), NAME, {})
