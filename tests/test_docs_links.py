"""The documentation's relative links point to files that exist, and the README stays a short user page.

Every Markdown file of the repository is read (README.md, CONTRIBUTING.md,
docs/**/*.md, ...), except those under hidden folders (.venv, .git, caches),
runs/, outputs/ and *.egg-info. Inline links and images (``[text](target)``,
``![alt](target)``) and reference definitions (``[label]: target``) are
checked; links inside code blocks and code spans are not links. External
links (http, https, mailto, ...) and pure ``#anchors`` are skipped; a
target's own ``#anchor`` or ``?query`` is dropped before the file is looked
up, relative to the Markdown file (or to the repository root for ``/path``).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_FOLDERS = {"runs", "outputs", "node_modules"}
README_MAX_LINES = 300

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[`~]*[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts[:-1]
        if any(part.startswith(".") or part in SKIPPED_FOLDERS or part.endswith(".egg-info") for part in parts):
            continue
        found.append(path)
    return found


def link_targets(text: str) -> list[str]:
    """The link targets of a Markdown text, code blocks and code spans left out."""
    text = FENCE.sub("", text)
    text = CODE_SPAN.sub("", text)
    targets = [match.group(1) for match in INLINE_LINK.finditer(text)]
    targets += [match.group(1) for match in REFERENCE.finditer(text)]
    return [target[1:-1] if target.startswith("<") and target.endswith(">") else target for target in targets]


def local_path(source: Path, target: str) -> Path | None:
    """The file a relative link points to, or None for an external link or a pure anchor."""
    if not target or target.startswith("#") or SCHEME.match(target) or target.startswith("//"):
        return None
    path = unquote(re.split(r"[#?]", target, maxsplit=1)[0])
    if not path:
        return None
    return (ROOT / path.lstrip("/")) if path.startswith("/") else (source.parent / path)


def broken_links(source: Path) -> list[str]:
    broken = []
    for target in link_targets(source.read_text(encoding="utf-8")):
        path = local_path(source, target)
        if path is None or path.exists():
            continue
        broken.append(target)
    return broken


def test_markdown_files_are_found():
    names = {path.relative_to(ROOT).as_posix() for path in markdown_files()}
    assert {"README.md", "CONTRIBUTING.md", "docs/configuration.md"} <= names
    assert not any(name.startswith((".venv/", "runs/")) for name in names)


@pytest.mark.parametrize("source", markdown_files(), ids=lambda path: path.relative_to(ROOT).as_posix())
def test_relative_links_point_to_existing_files(source):
    broken = broken_links(source)
    assert not broken, f"{source.relative_to(ROOT)} links to files that do not exist: {', '.join(broken)}"


def test_link_parsing(tmp_path):
    text = (
        'See [a](docs/a.md#part), ![img](pics/x.png "title"), [b](<with space.md>), [ext](https://example.com),\n'
        "[mail](mailto:x@example.com), [anchor](#here), [code](`not/a/link.md`).\n"
        "```\n[in a fence](fenced.md)\n```\n"
        "`[in a span](span.md)` and [ref]: refs/target.md\n"
        "[ref]: refs/target.md\n"
    )
    targets = link_targets(text)
    assert "docs/a.md#part" in targets and "pics/x.png" in targets and "with space.md" in targets
    assert "refs/target.md" in targets
    assert not any(target in ("fenced.md", "span.md") for target in targets)
    source = tmp_path / "page.md"
    assert local_path(source, "https://example.com") is None
    assert local_path(source, "mailto:x@example.com") is None
    assert local_path(source, "#here") is None
    assert local_path(source, "docs/a.md#part") == tmp_path / "docs" / "a.md"
    assert local_path(source, "with%20space.md") == tmp_path / "with space.md"


def test_a_missing_target_is_reported(tmp_path):
    (tmp_path / "there.md").write_text("x", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [gone](missing.md) [web](http://example.com)\n", encoding="utf-8")
    assert broken_links(page) == ["missing.md"]


def test_readme_is_a_short_user_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it at most {README_MAX_LINES} and move depth to docs/"
    )
