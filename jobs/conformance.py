"""Kept for old import paths: the module is :mod:`jobs.testing.conformance`."""

from jobs.testing.conformance import *  # noqa: F401,F403
