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


def test_the_tiny_models_old_place_in_diffaccel_testing_works_with_a_warning():
    import pytest

    import diffaccel.testing
    from diffaccel.adapters.text import testing as text_testing
    from diffaccel.adapters.diffusers.unet import testing as unet_testing

    for name, new in (("tiny_text_pipeline", text_testing), ("CharTokenizer", text_testing),
                      ("tiny_digits_pipeline", unet_testing)):
        with pytest.warns(DeprecationWarning, match=rf"diffaccel.testing.{name} moved to {new.__name__}.{name}") as w:
            old = getattr(diffaccel.testing, name)
        assert old is getattr(new, name) and w[0].filename == __file__  # the user's line, not the shim's
    assert "diffaccel.testing.tiny_text_pipeline" in CHANGELOG.read_text()
    with pytest.raises(AttributeError):
        diffaccel.testing.no_such_name  # noqa: B018
