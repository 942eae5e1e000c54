"""Every "§N" the code cites resolves to a section of docs/protocol.md, inside the repository."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_section_reference_resolves():
    page = (ROOT / "docs" / "protocol.md").read_text()
    sections = set(re.findall(r"\*\*§([0-9.]+)", page)) | set(re.findall(r"^## ([0-9]+)\.", page, re.M))
    cited = {}
    for path in [*ROOT.glob("bmq/**/*.py"), *ROOT.glob("bmq/**/*.py[xi]"), *ROOT.glob("bmq/**/*.pxi"),
                 *ROOT.glob("bmq/**/*.h"), *ROOT.glob("tests/**/*.py")]:
        for number in re.findall(r"§\s?([0-9]+(?:\.[0-9]+)?)", path.read_text(errors="replace")):
            cited.setdefault(number, path.relative_to(ROOT))
    # A reference to §N.M resolves to §N.M, or to §N when the page keeps N whole.
    missing = {n: str(p) for n, p in cited.items() if n not in sections and n.split(".")[0] not in sections}
    assert cited and not missing, missing
