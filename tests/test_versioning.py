"""The package and plugin-API versions, and the changelog that records each change to them."""

import importlib.metadata as md
import re
from pathlib import Path

import diffaccel

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"


def test_installed_version_is_the_one_in_the_code():
    assert md.version("diffaccel") == diffaccel.__version__  # pyproject reads it from there


def test_plugin_api_version_is_major_minor_and_the_changelog_names_both():
    major, minor = diffaccel.PLUGIN_API
    assert isinstance(major, int) and isinstance(minor, int)
    text = CHANGELOG.read_text()
    release = re.sub(r"\.dev\d+$", "", diffaccel.__version__)
    section = text.split(f"## {release}", 1)
    assert len(section) == 2, f"CHANGELOG.md has no section for {release}"
    assert f"Plugin API {major}.{minor}." in section[1].split("\n## ", 1)[0]
