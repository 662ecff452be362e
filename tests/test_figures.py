"""The measured figures live in one file (bench/figures.yaml): the README's block is rendered from
it and current, the docs home is the README, every cited section of the performance pages exists,
no figure a benchmark writes is typed anywhere else, and the pages keep their shape."""

import re
import shutil
from pathlib import Path

from markdown.extensions.toc import slugify

from ctiflow.bench import figures

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_the_readme_block_is_rendered_from_the_figures_file():
    text = (ROOT / "README.md").read_text()
    assert figures.readme_text(text) == text, "README.md's figures are stale: run ./dev figures"
    assert text.count(figures.BEGIN) == 1 and text.count(figures.END) == 1


def test_recording_a_benchmark_changes_the_file_and_the_readme_together(tmp_path):
    data, readme = tmp_path / "figures.yaml", tmp_path / "README.md"
    shutil.copy(figures.DATA, data)
    shutil.copy(ROOT / "README.md", readme)
    figures.record("sink", {"us": "9.99", "ratio": "7.77"}, table=[{"path": "p", "CPU µs a record": "9.99"}],
                   path=data, readme=readme)
    row = next(r for r in figures.load(data)["rows"] if r["id"] == "sink")
    assert row["values"]["us"] == "9.99" and row["machine"] == figures.machine()
    text = readme.read_text()
    assert "9.99 µs a record" in text and "**7.77×**" in text
    assert "9.99" not in (ROOT / "README.md").read_text()
    assert "| p | 9.99 |" in figures.detail("sink", figures.load(data))


def test_every_template_field_of_every_row_has_its_value():
    data = figures.load()
    for row in data["rows"]:
        assert {"id", "command", "date", "machine", "what", "ours", "baseline", "target"} <= set(row), row["id"]
        for name in ("what", "ours", "baseline", "target", "bound"):
            for field in re.findall(r"\{(\w+)\}", str(row.get(name, ""))):
                assert field in row.get("values", {}), f"{row['id']}.{name}: no value {field!r}"


def test_the_docs_home_is_the_readme():
    assert (DOCS / "index.md").read_text().strip() == "<!-- readme -->"


def _headings(page: Path) -> set[str]:
    return {slugify(h.strip().strip("`"), "-") for h in re.findall(r"^#{1,6} (.+)$", page.read_text(), re.M)}


def test_every_cited_section_of_the_performance_and_changelog_pages_exists():
    anchors = {name: _headings(DOCS / name) for name in ("performance.md", "changelog.md")}
    sources = [p for p in ROOT.rglob("*") if p.suffix in {".py", ".md", ".yaml", ".yml"} and p.is_file()
               and not {".venv", "build", ".ctiflow", ".git", "site"} & set(p.relative_to(ROOT).parts)]
    cited = 0
    for path in sources:
        for page, anchor in re.findall(r"(performance\.md|changelog\.md)#([\w-]+)", path.read_text(errors="ignore")):
            cited += 1
            assert anchor in anchors[page], f"{path.relative_to(ROOT)} cites {page}#{anchor}: no such heading"
    assert cited > 10


def test_no_figure_a_benchmark_writes_is_typed_elsewhere():
    """A value a benchmark writes (``values``) appears in the docs only where they render it: each
    value is looked for with the text that follows it in its template ("1.15 µs", "2.04×")."""
    readme = (ROOT / "README.md").read_text()
    readme = readme[:readme.index(figures.BEGIN)] + readme[readme.index(figures.END):]
    pages = {p.relative_to(ROOT).as_posix(): p.read_text() for p in DOCS.rglob("*.md") if p.name != "changelog.md"}
    pages["README.md"] = readme
    checked = 0
    for row in figures.load()["rows"]:
        text = " ".join(str(row.get(n, "")) for n in ("what", "ours", "baseline", "target", "bound"))
        for name, after in re.findall(r"\{(\w+)\}(.{0,3})", text):
            value = str(row["values"][name])
            if not re.search(r"\d\.\d", value):  # distinctive figures only (1.15, not 200)
                continue
            typed = value + after.rstrip("*").replace("\n", " ")
            checked += 1
            for page, content in pages.items():
                assert typed not in " ".join(content.split()), f"{page} types {row['id']}.{name}: {typed!r}"
    assert checked > 10


def test_the_performance_page_is_current_state_only():
    assert len((DOCS / "performance.md").read_text().splitlines()) < 250


def test_operator_and_concept_pages_are_documentation_not_notes():
    short = {p.relative_to(DOCS).as_posix(): n for folder in ("operators", "concepts") for p in (DOCS / folder).glob("*.md")
             if (n := len(p.read_text().splitlines())) < 60}
    assert not short, f"pages under 60 lines: {short}"


def test_no_cell_of_a_benchmark_table_is_typed_elsewhere():
    """The tables the benchmarks write (``table``) are rendered where they are shown, not copied:
    no distinctive cell (a decimal figure, or a number of six digits or more) is in a page."""
    readme = (ROOT / "README.md").read_text()
    readme = readme[:readme.index(figures.BEGIN)] + readme[readme.index(figures.END):]
    pages = {p.relative_to(ROOT).as_posix(): " ".join(p.read_text().split()) for p in DOCS.rglob("*.md")
             if p.name != "changelog.md"}
    pages["README.md"] = " ".join(readme.split())
    checked, typed = 0, []
    for row in figures.load()["rows"]:
        for cells in row.get("table") or []:
            for cell in map(str, cells.values()):
                if not re.search(r"\d\.\d\d|\d{1,3},\d{3},\d{3}|\d{3},\d{3}", cell) or cell.endswith(",000"):
                    continue  # not distinctive (a round number of keys or events is an input, not a figure)
                checked += 1
                typed += [f"{page} types {row['id']}'s cell {cell!r}" for page, content in pages.items()
                          if f"| {cell} |" in content or f" {cell} " in content]
    assert not typed, typed
    assert checked > 100
