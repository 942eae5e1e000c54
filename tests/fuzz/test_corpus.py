"""Every fuzz target on its kept corpus and on every crash the fuzzing ever found.

The coverage-guided fuzzing itself (``scripts/fuzz.py``, sanitized build, atheris) is not part
of the test run; this replays what it kept through the normal build, so that a regression of
a fixed crash fails here, and so that the targets themselves stay in working order.
"""
from __future__ import annotations

import pytest

from targets import CORPUS_DIR, CRASHES_DIR, TARGETS, corpus_files, replay


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_target_survives_its_corpus_and_past_crashes(name):
    assert (CORPUS_DIR / name).is_dir(), f"no kept corpus for {name}: python scripts/fuzz.py --seed --target {name}"
    assert replay(name) == len(corpus_files(name)) > 0


def test_every_crash_belongs_to_a_target():
    if not CRASHES_DIR.is_dir():
        pytest.skip("no crash found so far")
    assert {p.name for p in CRASHES_DIR.iterdir()} <= set(TARGETS)
