"""How the report writes numbers, durations and paths: 3 significant figures, no machine paths."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

SIGNIFICANT = 3
_ABSOLUTE = re.compile(r"(?<![\w.:/])/(?:[^\s/'\"<>]+/)+([^\s/'\"<>]*)")


def sig(value: float | None, digits: int = SIGNIFICANT) -> str:
    """Return ``value`` rounded to ``digits`` significant figures as plain text (``""`` for None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    value = float(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value.is_integer() and abs(value) < 10**digits:
        return str(int(value))  # an exact count (bits, seeds) keeps no trailing zeros
    if abs(value) < 1e-3:
        return f"{value:.{digits - 1}e}"
    rounded = round(value, digits - 1 - math.floor(math.log10(abs(value))))
    if rounded == 0:
        return "0"
    decimals = max(digits - 1 - math.floor(math.log10(abs(rounded))), 0)
    return f"{rounded:.{decimals}f}"


def paper_number(value: float | None) -> str:
    """Return a paper's own number as printed there (no trailing zeros), ``""`` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{float(value):g}"


def with_unit(text: str, unit: str | None) -> str:
    """Return ``text`` followed by ``unit`` (``%`` and ``x`` glued to the number, others after a space)."""
    if not text or not unit or (isinstance(unit, float) and math.isnan(unit)):
        return text
    return f"{text}{unit}" if unit in ("%", "x") else f"{text} {unit}"


def interval(value: float, lower: float | None, upper: float | None, unit: str | None = None) -> str:
    """Return ``value [lower, upper] unit`` at 3 significant figures; a point when the interval is empty."""
    text = sig(value)
    if _number(lower) and _number(upper) and not (lower == upper == value):
        text = f"{text} [{sig(lower)}, {sig(upper)}]"
    return with_unit(text, unit)


def paper_text(
    value: float, low: float | None = None, high: float | None = None, unit: str | None = None
) -> str:
    """Return the paper's value, or its range ``low to high`` when it reports one."""
    if _number(low) and _number(high) and low != high:
        return with_unit(f"{paper_number(low)} to {paper_number(high)}", unit)
    return with_unit(paper_number(value), unit)


def duration(seconds: float | None) -> str:
    """Return ``seconds`` as ``13 s``, ``32 min`` or ``2.5 h`` (``""`` when unknown)."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return ""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{sig(seconds / 3600, 2)} h"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
    except ValueError:
        return False
    return True


class Paths:
    """Turn machine paths into links relative to the report file and labels relative to the project."""

    def __init__(self, report: str | Path, root: str | Path | None):
        self.base = Path(report).resolve().parent
        self.root = Path(root).resolve() if root is not None else None

    def _anchors(self) -> list[Path]:
        return [p for p in (self.root, self.base) if p is not None]  # project-relative labels first

    def label(self, path: str | Path) -> str:
        """Return ``path`` relative to the report's folder or the project, else its last two parts."""
        path = Path(path).resolve()
        for anchor in self._anchors():
            if _inside(path, anchor):
                return path.relative_to(anchor).as_posix() or "."
        return "/".join(path.parts[-2:])

    def link(self, path: str | Path) -> str | None:
        """Return a link to ``path`` relative to the report, or None when it lies outside both anchors."""
        path = Path(path).resolve()
        if not any(_inside(path, anchor) for anchor in self._anchors()):
            return None
        if not _inside(self.base, self.root or self.base) and not _inside(path, self.base):
            return None  # a report outside the project reaches project files only through machine paths
        return Path(os.path.relpath(path, self.base)).as_posix()

    def scrub(self, text: str) -> str:
        """Return ``text`` (an error message, say) with machine paths made relative or cut to their name."""
        for anchor in self._anchors():
            text = text.replace(str(anchor) + os.sep, "").replace(str(anchor), ".")
        home = str(Path.home())
        if home not in ("/", ""):
            text = text.replace(home, "~")
        return _ABSOLUTE.sub(lambda m: f".../{m.group(1)}", text)
