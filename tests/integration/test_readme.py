"""The README is the front door: its Python examples run exactly as written, it stays short, and
every link in it leads somewhere (the guide pages it points to exist)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index, capsys):
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip(), "each example prints what it did"


def test_readme_is_a_front_door_not_a_report():
    # Issue #38: the tour and the links fit on a few screens; the benchmark detail lives in
    # docs/benchmarks.md, which the README's short summary links to.
    assert len(README.splitlines()) <= 200
    assert "(docs/benchmarks.md)" in README and "(docs/getting-started.md)" in README


def test_readme_links_lead_to_existing_files():
    targets = re.findall(r"\]\((?!https?://|#)([^)#]+)(?:#[^)]*)?\)", README)
    assert targets
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert not missing, missing


def test_readme_anchors_name_its_headings():
    # GitHub's (and MyST's) anchors: lower case, punctuation dropped, spaces as hyphens.
    anchors = {re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-")
               for heading in re.findall(r"^#+ (.+)$", README, flags=re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", README)
    assert set(links) <= anchors, set(links) - anchors
