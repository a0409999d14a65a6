"""README is for a newcomer: short, and it names the two commands that get one started."""

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
MAX_LINES = 250


def test_readme_stays_under_250_lines():
    lines = README.read_text().count("\n")
    assert lines < MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "thunder-mw --config config/demo.yaml" in text
    assert "bash scripts/test.sh" in text


def test_readme_links_every_page_of_docs():
    text = README.read_text()
    pages = sorted(p.name for p in (README.parent / "docs").glob("*.md"))
    missing = [name for name in pages if f"docs/{name}" not in text]
    assert not missing, f"README.md does not link {missing}"
