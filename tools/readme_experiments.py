"""Write README.md's experiments table from the notebook registry.

    python tools/readme_experiments.py            # rewrites the table in README.md
    python tools/readme_experiments.py --check    # exit 1 when README.md's table is not what the registry says

Each row is one experiment notebook (``rlq.experiments.registry.list_experiments``): its name, its description
(the first line of its first markdown cell) and its ``quick`` preset's wall time from ``PRESET_WALL_TIMES``.
The table sits between :data:`BEGIN` and :data:`END`; nothing else in README.md is touched.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlq.experiments.registry import Experiment

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN = (
    "<!-- generated from each notebook's first line and PRESET_WALL_TIMES by "
    "`python tools/readme_experiments.py`; regenerate, do not edit -->"
)
END = "<!-- end of generated experiments table -->"


class MarkersError(ValueError):
    """The text has not exactly one :data:`BEGIN` followed by one :data:`END`."""


def table(experiments: Iterable[Experiment]) -> str:
    """Return the Markdown table of ``experiments``: each one's name, description and quick preset's wall time."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| notebook | what it is | quick |", "|---|---|---|"]
    rows += [
        f"| `{exp.name}` | {cell(exp.description)} | {cell(exp.wall_times.get('quick', '-'))} |"
        for exp in experiments
    ]
    return "\n".join(rows)


def splice(text: str, generated: str, begin: str = BEGIN, end: str = END) -> str:
    """Return ``text`` with what lies between its ``begin`` and ``end`` lines replaced by ``generated``."""
    lines = text.split("\n")
    begins = [i for i, line in enumerate(lines) if line.strip() == begin]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise MarkersError(
            f"expected one {begin!r} line followed by one {end!r} line; found {len(begins)} and {len(ends)}"
        )
    return "\n".join([*lines[: begins[0] + 1], generated, *lines[ends[0] :]])


def render(readme_text: str, notebooks: str | Path | None = None) -> str:
    """Return ``readme_text`` with its experiments table generated from the notebooks in ``notebooks``
    (default: the repository's ``notebooks/``)."""
    from rlq.experiments.registry import list_experiments

    return splice(readme_text, table(list_experiments(notebooks)))


def rewrite_readme(argv: list[str], render_text: Callable[[str], str], what: str, script: str) -> int:
    """Rewrite README.md through ``render_text``, or with ``--check`` in ``argv`` return 1 when it is out of
    date, naming its ``what`` (e.g. "experiments table") and the ``script`` that regenerates it."""
    current = README.read_text()
    text = render_text(current)
    if "--check" in argv:
        if current != text:
            print(f"{README}'s {what} is out of date: run python tools/{script}", file=sys.stderr)
            return 1
        return 0
    README.write_text(text)
    return 0


def main(argv: list[str]) -> int:
    """Rewrite README.md's experiments table, or with ``--check`` return 1 when it is out of date."""
    return rewrite_readme(argv, render, "experiments table", "readme_experiments.py")


if __name__ == "__main__":
    sys.path.insert(0, str(README.parent))
    raise SystemExit(main(sys.argv[1:]))
