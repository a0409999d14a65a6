"""README stays the truth: its config reference is what the config models say."""

from pathlib import Path

from thunder_mw.schemas.config_reference import config_reference

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_config_reference_matches_the_config_models():
    text = README.read_text()
    start = text.index("<!-- config-reference:start -->\n") + len(
        "<!-- config-reference:start -->\n"
    )
    end = text.index("<!-- config-reference:end -->")
    assert text[start:end] == config_reference(), "run: python scripts/update_readme_reference.py"


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "thunder-mw --config config/demo.yaml" in text
    assert "bash scripts/test.sh" in text
