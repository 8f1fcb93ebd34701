"""Every relative link and anchor in README.md and docs/*.md points at something that exists.

GitHub renders these files; a link to a renamed file or a heading that changed its wording fails silently there,
so the check runs here, with GitHub's own rules for what a heading's anchor is.
"""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# A code span closes on a run of backticks exactly as long as the one that opened it (CommonMark).
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
# Link text may wrap onto the next line, hence [^\]]* rather than a single-line pattern; an optional "title"
# may follow the destination. Images (![alt](path)) match too, and their paths must exist just the same.
LINK = re.compile(r"\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
ATX_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
INLINE_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
HTML_TAG = re.compile(r"<[^>]+>")
# github-slugger keeps letters, marks, digits and connector punctuation (underscore), spaces and hyphens; \w is
# Python's Unicode letters, digits and underscore, which is the same set for the text these files hold.
NOT_SLUG_CHARACTER = re.compile(r"[^\w\- ]")
EXTERNAL = ("http://", "https://", "mailto:")


def prose_lines(text: str) -> list[str]:
    """The file's lines with fenced code blocks blanked, so a `# comment` in a shell example is no heading."""
    lines = text.splitlines()
    fence: str | None = None
    for index, line in enumerate(lines):
        opening = FENCE.match(line)
        if fence is None:
            if opening:
                fence = opening.group(1)
                lines[index] = ""
            continue
        # A fence closes only on the same character, at least as long, with nothing after it.
        if (
            opening
            and opening.group(1)[0] == fence[0]
            and len(opening.group(1)) >= len(fence)
            and not line[opening.end() :].strip()
        ):
            fence = None
        lines[index] = ""
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text, before duplicates are numbered."""
    rendered = HTML_TAG.sub("", INLINE_LINK.sub(r"\1", heading))
    return NOT_SLUG_CHARACTER.sub("", rendered.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor in a markdown file, numbered the way github-slugger numbers repeats."""
    occurrences: dict[str, int] = {}
    found: set[str] = set()
    for line in prose_lines(text):
        heading = ATX_HEADING.match(line)
        if heading is None:
            continue
        original = slug(heading.group(1) or "")
        result = original
        # A numbered slug can collide with a heading that really has that text, so keep counting until it is free.
        while result in occurrences:
            occurrences[original] += 1
            result = f"{original}-{occurrences[original]}"
        occurrences[result] = 0
        found.add(result)
    return found


def link_targets(text: str) -> list[str]:
    """The destinations of the file's inline links, leaving out code blocks and code spans."""
    prose = CODE_SPAN.sub("", "\n".join(prose_lines(text)))
    return LINK.findall(prose)


def problems(markdown: Path) -> list[str]:
    """One line per broken relative link or anchor in the file: the link and what is wrong with it."""
    found: list[str] = []
    for target in link_targets(markdown.read_text()):
        if target.startswith(EXTERNAL):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (markdown.parent / unquote(path_part)).resolve() if path_part else markdown.resolve()
        if not linked.is_relative_to(ROOT):
            found.append(f"({target}): {linked} is outside the repository")
            continue
        if not linked.exists():
            found.append(f"({target}): {linked.relative_to(ROOT)} does not exist")
            continue
        if not anchor:
            continue
        if linked.suffix != ".md":
            found.append(f"({target}): #{anchor} points into {linked.relative_to(ROOT)}, which has no headings")
        elif unquote(anchor) not in anchors(linked.read_text()):
            found.append(f"({target}): {linked.relative_to(ROOT)} has no heading whose anchor is #{anchor}")
    return found


@pytest.mark.parametrize("markdown", MARKDOWN_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(markdown: Path) -> None:
    broken = problems(markdown)
    assert not broken, f"{markdown.relative_to(ROOT)} has broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Securing the daemon's port", "securing-the-daemons-port"),
        ("Load test: `plimsoll loadtest`", "load-test-plimsoll-loadtest"),
        ("Status page and `plimsoll status`", "status-page-and-plimsoll-status"),
        ("Autoscaling with KEDA or an HPA", "autoscaling-with-keda-or-an-hpa"),
        ("What `make demo` shows", "what-make-demo-shows"),
        ("snake_case and  two spaces", "snake_case-and--two-spaces"),
    ],
)
def test_slug_matches_github_anchor(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_repeated_headings_are_numbered_like_github() -> None:
    text = "# Config\n## Config\n```sh\n# Config\n```\n### Config-1\n## Config\n"
    # The second Config takes config-1, so the heading that is literally "Config-1" becomes config-1-1; the
    # commented line inside the fence is no heading and takes no number.
    assert anchors(text) == {"config", "config-1", "config-1-1", "config-2"}


def test_links_in_code_are_not_checked() -> None:
    text = "`[a](missing.md)`\n```\n[b](missing.md)\n```\n[c](present.md) and\n[wrapped\ntext](#x)\n"
    assert link_targets(text) == ["present.md", "#x"]
