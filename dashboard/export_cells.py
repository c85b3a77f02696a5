"""How the dashboard writes one cell of an exported file, in Python (the server's "all shown" export) and, mirrored
once in ``CELLS_JS``, in the page (a card's own download): both must write the same file from the same data.

Text cells (run and tag names: anyone who can name a run writes them) follow OWASP's CSV-injection rule
(https://owasp.org/www-community/attacks/CSV_Injection): a cell that begins with ``=``, ``+``, ``-``, ``@``, tab or
carriage return gets a single quote in front, so a spreadsheet reads it as text and not as a formula such as
``=HYPERLINK(...)``, and every text cell is double-quoted with its quotes doubled, so a comma or quote in a name
cannot start a new cell. Numeric cells (step, wall time, value) stay numbers: ``-1.5`` is a number, not a formula,
and no name reaches them.

NaN and ±Inf stay distinct: ``nan``, ``inf``, ``-inf`` in CSV (what Python's ``float`` reads back), and in JSON, which
has no such numbers, the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, so the file is strict JSON (no bare
``NaN``; ``null`` would read as missing data).
"""
import math

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")     # OWASP's list: what makes a spreadsheet read a formula
_JSON_SPECIAL = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def csv_text(value):
    """``value`` (a run or tag name) as one CSV text cell: quoted, quotes doubled, a formula start quoted away."""
    text = str(value)
    if text.startswith(FORMULA_STARTS):
        text = "'" + text
    return '"' + text.replace('"', '""') + '"'


def csv_number(value):
    """``value`` as one CSV numeric cell: ``repr`` of the float, or ``nan``, ``inf``, ``-inf``."""
    value = float(value)
    if math.isfinite(value):
        return repr(value)
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"


def json_number(value):
    """``value`` as a strict-JSON value: the float, or the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""
    value = float(value)
    return value if math.isfinite(value) else _JSON_SPECIAL[csv_number(value)]


# The same three functions for the page, its formula test built from FORMULA_STARTS (the two cannot drift apart).
_JS_CLASS = "".join({"-": "\\-", "\t": "\\t", "\r": "\\r"}.get(c, c) for c in FORMULA_STARTS)
CELLS_JS = f"""
const csv_text = (value) => {{
  const text = String(value);
  return '"' + (/^[{_JS_CLASS}]/.test(text) ? "'" : "") + text.replace(/"/g, '""') + '"';
}};
const csv_number = (v) => Number.isFinite(v) ? String(v) : Number.isNaN(v) ? "nan" : v > 0 ? "inf" : "-inf";
const json_number = (v) => Number.isFinite(v) ? v : Number.isNaN(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity";
"""
