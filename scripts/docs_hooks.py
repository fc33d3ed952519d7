"""MkDocs hook of the docs site (mkdocs.yml): links from docs/ to repository files outside it.

A page may link a file of the repository that is not part of the site (``../configs/x.toml``,
``../adapters/diffusers/dit/README.md``): in the built site such a link would lead nowhere, and
strict mode reports it as not found. Here each one whose file exists in the repository is
rewritten: to the file on the repository's web page where mkdocs.yml names one (``repo_url``),
else to the path in code, which names the file without a dead link. A link to a file that does
not exist is left as it is, so that mkdocs reports it and strict mode fails the build.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

# [text](target) or [text](target#anchor), not an image; targets with a scheme are left alone
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
FENCE = re.compile(r"^(```|~~~)")


def outside_target(page_uri: str, target: str, docs_dir: Path, root: Path) -> PurePosixPath | None:
    """The repository path ``target`` (relative to the page ``page_uri``) names, when it lies
    outside ``docs_dir``; None for a link inside the docs, an absolute one or a URL."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    resolved = (docs_dir / PurePosixPath(page_uri).parent / target).resolve()
    if resolved.is_relative_to(docs_dir.resolve()):
        return None
    return PurePosixPath(resolved.relative_to(root.resolve()).as_posix()) if resolved.is_relative_to(root.resolve()) else None


def rewrite(markdown: str, page_uri: str, docs_dir: Path, root: Path, repo_url: str | None) -> str:
    """``markdown`` with its links to existing repository files outside the docs rewritten
    (not inside fenced code)."""

    def one(m: re.Match) -> str:
        path = outside_target(page_uri, m["target"], docs_dir, root)
        if path is None or not (root / path).exists():
            return m[0]
        if repo_url:
            return f"[{m['text']}]({repo_url.rstrip('/')}/blob/main/{path}{m['anchor'] or ''})"
        # the link's text, with the path in code beside it unless the text is the path already
        return f"`{path}`" if m["text"].strip("`") == str(path) else f"{m['text']} (`{path}`)"

    out, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(one, line))
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 - the hook's signature
    root = Path(config["config_file_path"]).parent
    return rewrite(markdown, page.file.src_uri, Path(config["docs_dir"]), root, config.get("repo_url"))
