"""The documentation site builds with ``mkdocs build --strict`` (no broken link, anchor or nav
entry), its job reference lists every field of the configuration model, and the README's links
into ``docs/`` resolve."""

import re
import subprocess
import sys
from pathlib import Path

from ctiflow.jobs.driver.config import JobConfig

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly_and_its_job_reference_has_every_field(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                                                                              "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    reference = (site / "reference" / "job" / "index.html").read_text()
    schema = JobConfig.model_json_schema()
    models = {"JobConfig": schema, **schema["$defs"]}
    for name, model in models.items():
        assert f'id="{name.lower()}"' in reference, name
        for field in model.get("properties", {}):
            assert f"<code>{field}</code>" in reference, f"{name}.{field}"
    assert "CTIFLOW_METRICS_PORT" in reference and "CTIFLOW_BOOTSTRAP" in reference
    assert (site / "operations" / "metrics" / "index.html").exists()


def test_the_readme_links_to_pages_that_exist():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) > 15
    for link in links:
        assert (ROOT / link).is_file(), link
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")):
        assert page in nav, f"docs/{page} is not in mkdocs.yml's nav"
