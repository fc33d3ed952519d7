"""The docs site (mkdocs.yml, ``make docs-site``): it builds in strict mode, its API reference
covers the public top-level names, and links to repository files outside docs/ are handled.

The build needs the ``docs`` extra (``make setup`` installs it); without MkDocs the build tests
are skipped, saying so. The hook's link rewriting is tested without MkDocs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAS_MKDOCS = all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"))
needs_mkdocs = pytest.mark.skipif(not HAS_MKDOCS, reason="the docs extra is not installed (pip install -e '.[docs]'; make setup does)")


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = _build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    return out


@needs_mkdocs
def test_site_builds_in_strict_mode_with_search_and_every_page(site):
    pages = [p for p in (ROOT / "docs").glob("*.md")]
    missing = [p.name for p in pages if not (site / ("" if p.stem == "index" else p.stem) / "index.html").is_file()]
    assert not missing, f"pages not built: {missing}"
    assert (site / "search" / "search_index.json").is_file()


@needs_mkdocs
def test_api_reference_documents_every_public_top_level_name(site):
    import diffaccel

    ids: set[str] = set()
    for page in ("diffaccel", "contract", "kit", "testing"):
        ids |= set(re.findall(r'id="(diffaccel[\w.]*)"', (site / "api" / page / "index.html").read_text()))
    names = {i.rsplit(".", 1)[-1] for i in ids}
    undocumented = sorted(n for n in diffaccel.__all__ if n != "__version__" and n not in names)
    assert not undocumented, f"in diffaccel.__all__ but not in the API reference (docs/api/diffaccel.md): {undocumented}"
    for module in ("diffaccel.kit", "diffaccel.testing", "diffaccel.contract.hookspecs"):
        assert module in ids


@needs_mkdocs
def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    # the project's own settings (validation, hooks, theme), on two pages, one with bad links
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n## Known\n")
    (docs / "bad.md").write_text("# Bad\n\n[a](index.md#known) [b](index.md#unknown) [c](nowhere.md)\n")
    text = (ROOT / "mkdocs.yml").read_text()
    text = re.sub(r"(?ms)^nav:.*", "", text)
    text = re.sub(r"(?ms)^  - mkdocstrings:.*?(?=^\S)", "", text)  # no API pages here
    text = text.replace("docs_dir: docs", f"docs_dir: {docs}").replace("scripts/docs_hooks.py", str(ROOT / "scripts" / "docs_hooks.py"))
    config = tmp_path / "mkdocs.yml"
    config.write_text(text)
    done = _build(config, tmp_path / "site")
    assert done.returncode != 0
    assert "'index.md#unknown'" in done.stderr and "'nowhere.md'" in done.stderr
    assert "'index.md#known'" not in done.stderr


def test_links_outside_docs_become_repository_paths(tmp_path):
    hooks = _hooks()
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.toml").write_text("")
    md = ("see [the config](../configs/a.toml), [`configs/a.toml`](../configs/a.toml#x), [gone](../configs/gone.toml), "
          "[page](other.md), ![img](../configs/a.toml)\n```\n[code](../configs/a.toml)\n```\n")
    out = hooks.rewrite(md, "page.md", tmp_path / "docs", tmp_path, None)
    assert out.startswith("see the config (`configs/a.toml`), `configs/a.toml`, [gone](../configs/gone.toml), [page](other.md), "
                          "![img](../configs/a.toml)")
    assert "[code](../configs/a.toml)" in out  # fenced code is left alone
    # from a page in a sub-folder the same file is one folder further up
    assert hooks.rewrite("[c](../../configs/a.toml)", "sub/p.md", tmp_path / "docs", tmp_path, None) == "c (`configs/a.toml`)"
    linked = hooks.rewrite("[c](../configs/a.toml#k)", "page.md", tmp_path / "docs", tmp_path, "https://example.org/r/")
    assert linked == "[c](https://example.org/r/blob/main/configs/a.toml#k)"
