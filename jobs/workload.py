"""Kept for old import paths: the module is :mod:`jobs.testing.workload`."""

from jobs.testing.workload import *  # noqa: F401,F403
