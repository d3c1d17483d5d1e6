"""The README's and the docs' Python examples run as written, and every relative link of the
README, ARCHITECTURE.md, docs/*.md and docs/bench/*.md resolves to a file inside the repository
(and, for a Markdown page with an anchor, to one of its headings)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [
    README,
    ROOT / "ARCHITECTURE.md",
    *sorted(DOCS.glob("*.md")),
    *sorted(DOCS.glob("bench/*.md")),
]


def python_blocks(page: Path) -> list[str]:
    # ```py blocks are shown, not run (the openai client needs a server: test_serve_models).
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def run_blocks(page: Path) -> dict:
    """A page's ``python`` blocks, in order, in one namespace."""
    namespace: dict = {}
    for block in python_blocks(page):
        exec(compile(block, str(page), "exec"), namespace)
    return namespace


def test_readme_python_blocks_run(capsys):
    assert len(python_blocks(README)) >= 1
    namespace = run_blocks(README)
    out = capsys.readouterr().out
    # The native engine answered the prompt, and the last request forked the cached prompt.
    assert out.splitlines()[0] == " Paris"
    assert namespace["gen"].stats["prefix_tokens_reused"] == len(namespace["ids"]) == 5


def test_python_api_blocks_run(capsys):
    page = DOCS / "python-api.md"
    assert len(python_blocks(page)) >= 2
    namespace = run_blocks(page)
    out = capsys.readouterr().out
    assert "100" in out
    # The transformers example ran: 4 prompt + 20 new tokens, the last not yet fed back.
    assert namespace["cache"].get_seq_length() == 23


def test_prefix_store_blocks_run(capsys):
    namespace = run_blocks(DOCS / "prefix-store.md")
    out = capsys.readouterr().out.split()
    # 3 chunks of 8 written from 24 tokens; 16 restored (whole chunks, leaving one to compute).
    assert out[:2] == ["3", "16"]
    assert namespace["more"].shape[1] == 28


def test_every_docs_page_with_python_runs_in_a_test():
    tested = {README.name, "python-api.md", "prefix-store.md"}
    for page in PAGES:
        if python_blocks(page):
            assert page.name in tested, f"{page}: its python blocks run in no test"


def test_readme_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    head = "\n".join(lines[:6])
    assert "./scripts/demo.sh" in head and "./scripts/test.sh" in head
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in ci


def test_readme_keeps_the_demo_section():
    text = README.read_text()
    assert "## What the demo prints" in text
    assert len(text.splitlines()) <= 350, "the README is the user's path: details go to docs/"


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors: headings lowercased, punctuation but '-' and '_' dropped, spaces '-'."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    anchors = set()
    for title in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def broken_links(pages: list[Path], root: Path) -> list[str]:
    broken = []
    for page in pages:
        for link in relative_links(page):
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: {link}"
            if not target.is_relative_to(root) or not target.exists():
                broken.append(f"{where} (no such file in the repository)")
            elif anchor and target.suffix == ".md" and anchor not in heading_anchors(target):
                broken.append(f"{where} (no such heading)")
    return broken


def test_relative_links_resolve_inside_the_repository():
    broken = broken_links(PAGES, ROOT)
    assert not broken, "\n".join(broken)


def test_pages_name_no_path_outside_the_repository():
    # A path in backticks that climbs out of the tree (`../x`) points at nothing a reader has.
    for page in PAGES:
        for span in re.findall(r"`([^`\n]+)`", page.read_text()):
            if span.startswith("../"):
                target = (page.parent / span.split()[0]).resolve()
                assert target.is_relative_to(ROOT), f"{page.relative_to(ROOT)}: `{span}`"


def test_the_link_checker_catches_a_broken_link(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "outside.md").write_text("# Outside\n")
    page = tmp_path / "repo" / "page.md"
    page.write_text(
        "# Title\n\n```text\n[in a block](ignored.md)\n```\n"
        "[a](missing.md) [b](page.md#title) [c](#nope) [d](../outside.md) [e](https://x.org)\n"
    )
    assert relative_links(page) == ["missing.md", "page.md#title", "#nope", "../outside.md"]
    assert heading_anchors(page) == {"title"}
    assert broken_links([page], tmp_path / "repo") == [
        "page.md: missing.md (no such file in the repository)",
        "page.md: #nope (no such heading)",
        "page.md: ../outside.md (no such file in the repository)",
    ]
