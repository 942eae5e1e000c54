"""Every fuzz target on its kept corpus and on every crash the fuzzing ever found.

The coverage-guided fuzzing itself (``scripts/fuzz.py``, sanitized build, atheris) is not part
of the test run; this replays what it kept through the normal build, so that a regression of
a fixed crash fails here, and so that the targets themselves stay in working order.
"""
from __future__ import annotations

import pytest

from targets import CORPUS_DIR, CRASHES_DIR, OPEN_FINDINGS, TARGETS, corpus_files, replay


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_target_survives_its_corpus_and_past_crashes(name):
    assert (CORPUS_DIR / name).is_dir(), f"no kept corpus for {name}: python scripts/fuzz.py --seed --target {name}"
    assert replay(name) == len(corpus_files(name)) > 0


def test_every_crash_belongs_to_a_target_and_every_open_finding_is_kept():
    assert {p.name for p in CRASHES_DIR.iterdir()} <= set(TARGETS)
    assert all((CRASHES_DIR / finding).is_file() for finding in OPEN_FINDINGS)


@pytest.mark.parametrize("finding", [pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=why))
                                     for f, why in sorted(OPEN_FINDINGS.items())])
def test_open_finding_still_fails(finding):
    """A crash found and not fixed yet still fails (strict xfail): once the fix lands this
    passes unexpectedly, and the entry leaves OPEN_FINDINGS to join the regressions above."""
    name = finding.split("/")[0]
    paths = [p for p in corpus_files(name, open_findings=True) if f"{name}/{p.name}" == finding]
    replay(name, paths)
