"""The repository stands alone (issue 25, point 9): the README and ``docs/`` link only to
files of the repository (or to the web), and name nothing in the ``shared`` folder that a
user's clone lacks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_local_link_is_a_file_of_the_repository(page: Path) -> None:
    text = page.read_text()
    for target in LINK.findall(text):
        if re.match(r"^(https?|mailto):", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name}: {target} is outside the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"
    assert "../shared" not in text, f"{page.name} names ../shared"


def test_the_design_page_keeps_the_section_numbers_the_code_cites() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", design, re.M)]
    assert numbers == list(range(1, 11))
    cited = set()
    for source in (ROOT / "src").rglob("*.py"):
        cited.update(int(n) for n in re.findall(r"DESIGN\.md,? section (\d+)", source.read_text()))
    assert cited, "the code cites sections of the design"
    assert cited <= set(numbers), sorted(cited - set(numbers))
