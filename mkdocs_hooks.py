"""MkDocs hooks (mkdocs.yml → hooks): the job file reference is generated at build time from the
configuration model (jobs/reference_doc.py), so docs/reference/job.md holds only its frame."""

from ctiflow.jobs.reference_doc import job_reference

MARKER = "<!-- job-reference -->"


def on_page_markdown(markdown, page, config, files):
    if MARKER in markdown:
        return markdown.replace(MARKER, job_reference())
    return markdown
