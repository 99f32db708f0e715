"""Write docs/api.md: rlq's public names, one line each, from their docstrings.

    python tools/api_docs.py            # rewrites docs/api.md
    python tools/api_docs.py --check    # exit 1 when docs/api.md is not what the code says

The public names are the ``__all__`` of each package a user imports from (:data:`PACKAGES`).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

PACKAGES = {
    "rlq.compress": "Compression transforms of any nn.Module: block-circulant weights, magnitude pruning, GST's schedule.",
    "rlq.quant": "Quantization of any nn.Module: PTQ, QAT, int8 ONNX export, sizes in bits.",
    "rlq.sb3": "Stable-Baselines3 callbacks and checkpoints: GST, gradual pruning and QAT on any SB3 algorithm.",
    "rlq.deploy": "A CPU runtime for compressed policies: each layer computed in its stored form, a batch at a time.",
    "rlq.stats": "Interval estimates over seeds (rliable's IQM with 95% stratified-bootstrap intervals).",
    "rlq.claims": "The papers' claims and the one rule that judges each from its interval.",
}
DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def first_line(obj: object) -> str:
    """Return the first paragraph of ``obj``'s own docstring (not an inherited one) on one line, or a dash."""
    doc = obj.__doc__ if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj) else None
    if inspect.isclass(obj) and "__doc__" not in vars(obj):
        doc = None
    if not doc or not doc.strip():
        return "-"
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def kind(obj: object) -> str:
    return "class" if inspect.isclass(obj) else "function" if callable(obj) else "constant"


def render() -> str:
    """Return the text of docs/api.md."""
    lines = [
        "# rlq's public API",
        "",
        "Generated from the docstrings by `python tools/api_docs.py` (a test checks it is current). Each package",
        "lists the names of its `__all__`; everything else is internal and may change.",
        "",
    ]
    for package, summary in PACKAGES.items():
        module = importlib.import_module(package)
        lines += [f"## `{package}`", "", summary, "", "| name | kind | what it is |", "|---|---|---|"]
        for name in module.__all__:
            obj = getattr(module, name)
            text = first_line(obj) if kind(obj) != "constant" else f"`{obj!r}`"[:100]
            lines.append(f"| `{name}` | {kind(obj)} | {text.replace('|', chr(92) + '|')} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = DOC.read_text() if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is out of date: run python tools/api_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
