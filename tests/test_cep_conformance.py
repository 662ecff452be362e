"""Every recorded Flink CEP scenario, one test per case (see jobs/testing/conformance.py).

The case file ships with the repository (``tests/data/flink-cep-cases.json``; where it came
from: ``tests/data/README.md``); ``CTIFLOW_CEP_CASES`` overrides the path. A missing file is a failure, never a skip: the
conformance claim must not pass vacuously.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ctiflow.jobs.testing.conformance import DEFAULT_CASES, load_cases, run_case

CASES_PATH = Path(os.environ.get("CTIFLOW_CEP_CASES", DEFAULT_CASES))
EXPECTED_CASE_COUNT = 222


def _cases() -> list:
    if not CASES_PATH.is_file():
        return [pytest.param(None, id="case-file-missing")]
    return [pytest.param(case, id=case["case_id"]) for case in load_cases(CASES_PATH)]


def test_case_file_has_all_recorded_cases() -> None:
    assert CASES_PATH.is_file(), (
        f"conformance cases not found at {CASES_PATH} (set CTIFLOW_CEP_CASES)"
    )
    assert len(load_cases(CASES_PATH)) == EXPECTED_CASE_COUNT


@pytest.mark.parametrize("case", _cases())
def test_matches_equal_flinks(case: dict | None) -> None:
    assert case is not None, f"conformance cases not found at {CASES_PATH} (set CTIFLOW_CEP_CASES)"
    result = run_case(case)
    assert result.passed, "\n".join(result.problems)
