"""User-typed filter patterns (run, tag and hparams filters).

Python's ``re`` backtracks: a pattern such as ``(.+)+#`` against a 27-character name runs for tens of seconds on the
IO loop and freezes every session. Every pattern a user types goes through :func:`compile_filter`, which compiles
with RE2 (google-re2): matching is linear in the text whatever the pattern, and compilation memory is capped.
"""

from __future__ import annotations

import re2

__all__ = ["FilterError", "MAX_PATTERN_CHARS", "compile_filter"]

#: A filter box holds a name fragment or a short regex; anything longer is a paste accident or an attack.
MAX_PATTERN_CHARS = 1000
# RE2's compiled program is bounded by this budget (its default is 8 MiB too; stated so it cannot drift upwards).
_MAX_MEM = 8 << 20


class FilterError(ValueError):
    """An invalid filter pattern: ``pattern`` as typed, ``reason`` what RE2 (or the length cap) objected to."""

    def __init__(self, pattern, reason: str):
        super().__init__(f"invalid regex {pattern!r}: {reason}")
        self.pattern = pattern
        self.reason = reason


def compile_filter(pattern: str, *, ignore_case: bool = False, literal: bool = False):
    """Compile a user-typed ``pattern`` with RE2 and return the compiled object (``.search(text)`` is what the
    views use). ``literal`` matches the text as typed. An empty pattern matches everything.

    Raises :class:`FilterError` for a pattern RE2 rejects (syntax, or a feature it has no linear-time
    algorithm for: backreferences, lookaround) and for a pattern longer than :data:`MAX_PATTERN_CHARS`."""
    if not isinstance(pattern, str):
        raise FilterError(pattern, f"expected text, got {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise FilterError(pattern[:40] + "...", f"{len(pattern)} characters long, at most {MAX_PATTERN_CHARS} accepted")
    options = re2.Options()
    options.log_errors = False            # RE2 would print every rejected pattern to stderr
    options.max_mem = _MAX_MEM
    options.case_sensitive = not ignore_case
    options.literal = literal
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        reason = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise FilterError(pattern, f"{reason} (RE2 syntax: no backreferences or lookaround)") from None
