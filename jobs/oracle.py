"""Kept for old import paths: the module is :mod:`jobs.testing.oracle`."""

from jobs.testing.oracle import *  # noqa: F401,F403
