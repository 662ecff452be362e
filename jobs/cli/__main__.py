"""``python -m ctiflow.jobs.cli …``: the same as ``ctiflow …``."""

from ctiflow.jobs.cli import main

if __name__ == "__main__":
    main()
