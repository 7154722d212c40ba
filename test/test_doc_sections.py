"""A docstring or comment that sends the reader to a section of the documentation (``README "Threat model"``,
``docs/contract.md "Robots and safety"``) names a heading that exists there: the README was cut to a user's
manual and its sections moved to docs/, and a pointer to a section that is gone sends the reader nowhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# README "X", README, "X", README's "X", docs/contract.md "X" (a section's title, not a file's name)
REFERENCE = re.compile(r"(?<![/\w])(README|docs/[a-z_]+\.md)(?:\.md)?(?:'s|,)? \"(?P<title>[A-Z][^\"/]*)\"")


def _headings(doc: str) -> set[str]:
    path = ROOT / ("README.md" if doc == "README" else doc)
    return {m[1].strip() for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}


def _references() -> list[tuple[str, int, str, str]]:
    out = []
    for folder in ("timelyllm_ros", "bench", "test", "devtools"):
        for py in sorted((ROOT / folder).rglob("*.py")):
            if py.name == Path(__file__).name:  # its own examples
                continue
            for no, line in enumerate(py.read_text().splitlines(), 1):
                out += [(str(py.relative_to(ROOT)), no, m[1], m["title"]) for m in REFERENCE.finditer(line)]
    return out


def test_section_references_name_a_heading_of_that_document():
    refs = _references()
    assert len(refs) >= 5  # the pattern still finds the references this test was written for
    # a title may be the start of a longer heading ("Threat model" for "Threat model: who may steer a robot")
    stale = [f"{f}:{no}: {doc} \"{title}\"" for f, no, doc, title in refs
             if not any(h == title or h.startswith(title + ":") for h in _headings(doc))]
    assert not stale, "\n".join(stale)


def test_the_pattern_reads_the_forms_in_use():
    found = [(m[1], m["title"]) for m in REFERENCE.finditer(
        'README "A b"; README, "C d"; README\'s "E"; docs/contract.md "F g"; README.md, "load_sweep/"; '
        'tools/README.md, "Pitfalls"')]
    assert found == [("README", "A b"), ("README", "C d"), ("README", "E"), ("docs/contract.md", "F g")]
