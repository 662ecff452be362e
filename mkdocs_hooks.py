"""MkDocs hooks (mkdocs.yml → hooks): pages generated at build time so they cannot drift.

- ``<!-- job-reference -->``: the job file reference, from the configuration model (jobs/tools/reference_doc.py).
- ``<!-- readme -->``: the README's body (the docs home is the README; links into ``docs/`` rebased).
- ``<!-- figures -->``: the measured figures table and what bounds each row, from bench/figures.yaml;
  ``<!-- figures-detail: ID -->``: one benchmark's full table as it wrote it; ``<!-- figures-row: ID -->``:
  that row's cells as a sentence.
- ``<!-- example: NAME -->``: a worked example run through the real operator (jobs/tools/docs_examples.py);
  its pictures are drawn before the build into docs/generated/.
"""

import re
from pathlib import Path

from ctiflow.bench import figures
from ctiflow.jobs.tools.reference_doc import job_reference

ROOT = Path(__file__).resolve().parent
_DETAIL = re.compile(r"<!-- figures-detail: ([\w-]+) -->")
_ROW = re.compile(r"<!-- figures-row: ([\w-]+) -->")
_EXAMPLE = re.compile(r"<!-- example: ([\w-]+) -->")


def readme_body() -> str:
    """README.md as the docs home: its links into ``docs/`` made relative to ``docs/``."""
    text = (ROOT / "README.md").read_text()
    return re.sub(r"\]\(docs/", "](", text)


def on_pre_build(config):
    """Pictures drawn from the examples, into docs/generated/ (not in git) before the files are read."""
    from ctiflow.jobs.tools.docs_examples import bins_picture, cti_picture, histogram_picture

    out = ROOT / "docs" / "generated"
    out.mkdir(exist_ok=True)
    bins_picture(out / "bins-timeline.png")
    histogram_picture(out / "histogram-buckets.png")
    cti_picture(out / "cti-partitions.png")


def on_page_markdown(markdown, page, config, files):
    prefix = "../" * page.file.src_uri.count("/")
    if "<!-- job-reference -->" in markdown:
        markdown = markdown.replace("<!-- job-reference -->", job_reference())
    if "<!-- readme -->" in markdown:
        markdown = markdown.replace("<!-- readme -->", readme_body())
    if "<!-- figures -->" in markdown:
        markdown = markdown.replace("<!-- figures -->", figures.block(prefix=prefix))
    markdown = _DETAIL.sub(lambda m: figures.detail(m.group(1)), markdown)
    markdown = _ROW.sub(lambda m: figures.summary(m.group(1), prefix=prefix), markdown)
    if _EXAMPLE.search(markdown):
        from ctiflow.jobs.tools.docs_examples import example

        markdown = _EXAMPLE.sub(lambda m: example(m.group(1)), markdown)
    return markdown
