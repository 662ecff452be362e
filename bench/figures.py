"""The measured figures, kept in one data file (``bench/figures.yaml``) and rendered everywhere
they are shown: the README's Performance block (``./dev figures`` rewrites it; a test checks it
is current), and at docs build the docs home (the README's body), the performance page and the
limits page (``mkdocs_hooks.py``).

A row is one benchmark result: its ``command``, ``date`` and ``machine``, the table cells
(``what``, ``ours``, ``baseline``, ``target``) and optionally what bounds it (``bound``). Cells
are Markdown templates: ``{name}`` takes the row's ``values``, which a benchmark that measures
the row writes itself (:func:`record`); the rest of a row is edited by hand. Links are written
relative to ``docs/`` and rebased for the page they appear on.

Usage: ``python -m ctiflow.bench.figures`` rewrites the README block; ``--check`` exits 1 when
it is stale.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).with_name("figures.yaml")
README = ROOT / "README.md"
BEGIN = "<!-- figures: begin (generated from bench/figures.yaml by ./dev figures; do not edit) -->"
END = "<!-- figures: end -->"
_LINK = re.compile(r"\]\((?!https?://|#)([^)]+)\)")


def load(path: Path = DATA) -> dict[str, Any]:
    """The data file: ``{"intro": str, "bounds_intro": str, "rows": [row, ...]}``."""
    return yaml.safe_load(path.read_text())


def save(data: dict[str, Any], path: Path = DATA) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=110))


def machine() -> str:
    """This machine, as rows name it."""
    return f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"


def record(row_id: str, values: dict[str, Any], *, table: list[dict] | None = None, path: Path | None = None,
           readme: Path | None = None) -> None:
    """A benchmark's new figures for row ``row_id``: its values (and its full table, which the
    performance page shows), today's date and this machine; the README block is rewritten.
    ``path`` and ``readme`` default to :data:`DATA` and :data:`README` as they are at the call."""
    path, readme = path or DATA, readme or README
    data = load(path)
    row = next((r for r in data["rows"] if r["id"] == row_id), None)
    if row is None:
        raise KeyError(f"bench/figures.yaml has no row {row_id!r}")
    row["values"] = {**row.get("values", {}), **values}
    if table is not None:
        row["table"] = table
    row["date"] = datetime.date.today().isoformat()
    row["machine"] = machine()
    save(data, path)
    if readme.exists():
        write_readme(readme, data)


def rows_of(table) -> list[dict[str, str]]:
    """A printed ``rich`` table as :func:`record` keeps a row's table (header → cell, in order)."""
    headers = [str(c.header) for c in table.columns]
    return [dict(zip(headers, map(str, cells))) for cells in zip(*(list(c.cells) for c in table.columns))]


def verdict(met: bool) -> str:
    """A target's cell: ``met`` or a bold ``missed``."""
    return "met" if met else "**missed**"


def thousands(rate: float) -> str:
    """A rate as rows show it: ``134.3k``."""
    return f"{rate / 1e3:,.1f}k"


def _cell(row: dict, name: str, prefix: str) -> str:
    text = str(row.get(name, "")).strip().replace("\n", " ")
    text = text.format_map(row.get("values", {})) if "{" in text else text
    return _LINK.sub(lambda m: f"]({prefix}{m.group(1)})", text)


def table(data: dict | None = None, *, prefix: str = "") -> str:
    """The figures table in Markdown (links rebased with ``prefix``: ``docs/`` from the repository's
    root, ``../`` from a page one folder down)."""
    data = load() if data is None else data
    lines = ["| what (`./dev bench …`) | ours | baseline, same run | target |", "| --- | --- | --- | --- |"]
    for row in data["rows"]:
        what = f"{_cell(row, 'what', prefix)} ({row['date']})"
        lines.append(f"| {what} | {_cell(row, 'ours', prefix)} | {_cell(row, 'baseline', prefix)} | "
                     f"{_cell(row, 'target', prefix)} |")
    return "\n".join(lines)


def bounds(data: dict | None = None, *, prefix: str = "") -> str:
    """What bounds each row, one bullet a row that says."""
    data = load() if data is None else data
    return "\n".join(f"- **{row.get('name', row['id'])}**: {_cell(row, 'bound', prefix)}"
                     for row in data["rows"] if row.get("bound"))


def detail(row_id: str, data: dict | None = None) -> str:
    """A row's full table as its benchmark wrote it, with the date, machine and command."""
    data = load() if data is None else data
    row = next(r for r in data["rows"] if r["id"] == row_id)
    table = row.get("table") or []
    if not table:
        raise KeyError(f"bench/figures.yaml: row {row_id!r} has no table (its benchmark writes one)")
    cols = list(table[0])
    lines = [f"`{row['command']}`, {row['date']}, {row['machine']}:", "",
             "| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in table]
    return "\n".join(lines)


def summary(row_id: str, data: dict | None = None, *, prefix: str = "") -> str:
    """A row's cells as one sentence (ours; the baseline; the target), for prose that cites it."""
    data = load() if data is None else data
    row = next(r for r in data["rows"] if r["id"] == row_id)
    return f"{_cell(row, 'ours', prefix)}; {_cell(row, 'baseline', prefix)}; target: {_cell(row, 'target', prefix)}."


def block(data: dict | None = None, *, prefix: str = "") -> str:
    """The whole Performance block: intro, table, what bounds each row."""
    data = load() if data is None else data
    parts = [_LINK.sub(lambda m: f"]({prefix}{m.group(1)})", data["intro"].strip()), table(data, prefix=prefix),
             _LINK.sub(lambda m: f"]({prefix}{m.group(1)})", data["bounds_intro"].strip()),
             bounds(data, prefix=prefix)]
    return "\n\n".join(parts)


def readme_text(text: str, data: dict | None = None) -> str:
    """``text`` (the README) with its block between :data:`BEGIN` and :data:`END` rendered anew."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + block(data, prefix="docs/") + "\n" + text[end:]


def write_readme(readme: Path = README, data: dict | None = None) -> bool:
    """Rewrite the README's block; → whether it changed."""
    old = readme.read_text()
    new = readme_text(old, data)
    if new != old:
        readme.write_text(new)
    return new != old


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--check" in argv:
        text = README.read_text()
        if readme_text(text) != text:
            print("README.md's figures are not those of bench/figures.yaml: run ./dev figures", file=sys.stderr)
            return 1
        return 0
    print("README.md rewritten" if write_readme() else "README.md already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
