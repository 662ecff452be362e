"""Print pyproject.toml's runtime dependencies as a requirements list, minus excluded names.

The image uses it to install everything except pyspark (and py4j), which come from the
apache/spark base image so that the driver's Spark is exactly the cluster's:

    python deploy/requirements.py pyproject.toml --exclude pyspark --exclude py4j
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: str, exclude: list[str], extras: list[str] = ()) -> list[str]:
    with open(pyproject, "rb") as fh:
        project = tomllib.load(fh)["project"]
    deps = list(project.get("dependencies", []))
    for extra in extras:
        deps += project.get("optional-dependencies", {}).get(extra, [])
    skip = {canonical(n) for n in exclude}
    out = []
    for dep in deps:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", dep)
        if not m:
            raise SystemExit(f"cannot parse dependency {dep!r} in {pyproject}")
        if canonical(m.group(1)) not in skip:
            out.append(dep.split("#", 1)[0].strip())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pyproject")
    ap.add_argument("--exclude", action="append", default=[], help="distribution name to leave out")
    ap.add_argument("--extra", action="append", default=[], help="also list this optional-dependency group")
    args = ap.parse_args(argv)
    print("\n".join(requirements(args.pyproject, args.exclude, args.extra)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
