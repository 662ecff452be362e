"""``python -m jobs.cli …``: the same as ``ctiflow …``."""

from jobs.cli import main

if __name__ == "__main__":
    main()
