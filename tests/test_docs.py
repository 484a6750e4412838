"""The docs cannot go stale silently (issue 33 item 5). No build needed: files are only read.

- docs/architecture.md's core-tree table lists exactly the folders of csrc/core that hold source files;
- each Python module its module table names exists;
- every relative link of README.md and docs/*.md points to an existing file;
- README.md is a front page: at most 250 lines, and its quick start (the first fenced block under `## Quick start`)
  holds exactly two commands (non-empty lines that are not comments).
"""
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
CORE = REPO / "csrc" / "core"
ARCH = REPO / "docs" / "architecture.md"
README = REPO / "README.md"
SOURCE_SUFFIXES = {".h", ".hpp", ".cuh", ".c", ".cc", ".cpp", ".cu"}
PACKAGES = ("transformer_engine_torch", "transformer_engine_jax")
README_MAX_LINES = 250


def _block(text: str, name: str) -> str:
    """The text between `<!-- name: begin -->` and `<!-- name: end -->` (exactly one such pair)."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"docs/architecture.md needs one {begin} ... {end} block"
    return text.split(begin)[1].split(end)[0]


def _first_column(block: str) -> list:
    """The backquoted names of a Markdown table's first column (header and separator rows have none)."""
    names = []
    for line in block.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|", line.strip())
        if m:
            names.append(m.group(1))
    return names


def test_core_tree_matches_architecture_doc():
    listed = {name.rstrip("/") for name in _first_column(_block(ARCH.read_text(), "core-tree"))}
    actual = {str(p.parent.relative_to(CORE)) for p in CORE.rglob("*")
              if p.is_file() and p.suffix in SOURCE_SUFFIXES and p.parent != CORE}
    assert listed, "the core-tree block of docs/architecture.md lists no folder"
    assert not actual - listed, f"folders of csrc/core missing from docs/architecture.md: {sorted(actual - listed)}"
    assert not listed - actual, f"docs/architecture.md lists folders csrc/core does not have: {sorted(listed - actual)}"


def test_python_modules_of_architecture_doc_exist():
    names = _first_column(_block(ARCH.read_text(), "py-modules"))
    assert {n.split(".")[0] for n in names} == set(PACKAGES), f"the module table must cover both packages: {names}"
    missing = []
    for name in names:
        path = REPO.joinpath(*name.split("."))
        if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()):
            missing.append(name)
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def _markdown_files():
    return [README] + sorted((REPO / "docs").glob("*.md"))


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):  # a URL, or an anchor on the same page
            continue
        file = target.split("#")[0]
        if not (path.parent / file).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(REPO)}: links to files that do not exist: {broken}"


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the front page keeps to " \
                                           f"{README_MAX_LINES} (details go to docs/)"
    start = lines.index("## Quick start")
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    close = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    commands = [ln for ln in lines[fence + 1:close] if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(commands) == 2, f"README.md's quick start must hold exactly two commands, got {commands}"
