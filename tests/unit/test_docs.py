"""The docs point at what is there: README.md and docs/*.md, their links and the paths they name.

Owns: reading the Markdown (fenced blocks apart, headings, links, code spans), GitHub's heading
anchors, and the checks. Every relative link must resolve to a file or folder inside the
repository, and its ``#anchor`` to a heading of the Markdown file it names (GitHub's slug rule:
lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` for repeats). Every token of a
code span (and of a fenced block) that reads as a repository path under ``operator/``,
``tests/``, ``hack/``, ``charts/`` or ``benchmarks/`` must exist, and so must a code span's path
inside the package (``agent/runner.py``, ``dra_gpu/exits.py``), so that a module moved or renamed
leaves no doc naming its old place. Placeholders (``<version>``, ``*``, ``{a,b}``) are not paths.

Must not: need anything beyond the checkout (no network, no binaries, no cluster), or check links
to the web (their pages are not ours to keep).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATH_ROOTS = ("operator/", "tests/", "hack/", "charts/", "benchmarks/")
PLACEHOLDER = re.compile(r"[<>*{}$…\[\]|]")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def docs(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


@dataclasses.dataclass(frozen=True)
class Markdown:
    """One file, read as GitHub reads it for links: prose apart from fenced blocks."""

    prose: str
    """The text outside fenced blocks (one fenced block's lines are left out, not joined)."""
    fenced: str
    headings: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> Markdown:
        prose: list[str] = []
        fenced: list[str] = []
        headings: list[str] = []
        fence = ""
        for line in path.read_text().splitlines():
            opened = FENCE.match(line)
            if fence:
                if opened and opened.group(1) == fence:
                    fence = ""
                else:
                    fenced.append(line)
                continue
            if opened:
                fence = opened.group(1)
                continue
            prose.append(line)
            heading = HEADING.match(line)
            if heading:
                headings.append(heading.group(2))
        return cls("\n".join(prose), "\n".join(fenced), tuple(headings))

    def anchors(self) -> set[str]:
        seen: dict[str, int] = {}
        found = set()
        for heading in self.headings:
            slug = github_slug(heading)
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        return found

    def blocks(self) -> list[str]:
        """Paragraphs and table rows: a code span never reaches past its own."""
        return re.split(r"\n\s*\n|\n(?=\|)", self.prose)

    def links(self) -> list[str]:
        found = []
        for block in self.blocks():
            # A link written inside a code span is text, not a link.
            text = CODE_SPAN.sub(lambda m: "`" + m.group(2).replace("](", "] (") + "`", block)
            found += LINK.findall(text)
        return found

    def code_spans(self) -> list[str]:
        return [m.group(2) for block in self.blocks() for m in CODE_SPAN.finditer(block)]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered, lower case, punctuation dropped
    (letters, digits, ``_``, ``-`` and spaces kept), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def path_tokens(text: str) -> list[str]:
    tokens = []
    for raw in text.split():
        token = raw.lstrip("\"'(").rstrip("\"'),;:.").split("::", 1)[0]
        if token and not PLACEHOLDER.search(token):
            tokens.append(token)
    return tokens


def repository_path(token: str, repo: Path, in_code_span: bool) -> Path | None:
    """Where in the checkout ``token`` says it is, or None when it names no repository path:
    under one of ``PATH_ROOTS``, or (in a code span) inside the package, from ``dra_gpu/`` or
    from one of its folders (``agent/runner.py``)."""
    if token.startswith(PATH_ROOTS):
        return repo / token
    package = repo / "operator" / "dra_gpu"
    first = token.split("/", 1)[0]
    if not in_code_span or not first or first == token:
        return None
    if first == "dra_gpu":
        return package.parent / token
    if (package / first / "__init__.py").is_file():
        return package / token
    return None


def broken(repo_docs: list[Path], repo: Path = REPO) -> list[str]:
    """Every broken link, anchor or path of these files, as ``file: what``."""
    repo = repo.resolve()
    read = {path.resolve(): Markdown.read(path) for path in repo_docs}
    problems = []
    for path, markdown in read.items():
        name = path.relative_to(repo)
        for target in markdown.links():
            if SCHEME.match(target):
                continue
            where, _, anchor = target.partition("#")
            linked = (path.parent / where).resolve() if where else path
            if not linked.is_relative_to(repo):
                problems.append(f"{name}: link {target} leaves the repository")
                continue
            if not linked.exists():
                problems.append(f"{name}: link {target}: no {linked.relative_to(repo)}")
                continue
            if not anchor:
                continue
            if linked.suffix != ".md":
                problems.append(
                    f"{name}: link {target}: an anchor into a file that is not Markdown"
                )
                continue
            other = read.get(linked) or Markdown.read(linked)
            if anchor not in other.anchors():
                problems.append(f"{name}: link {target}: no heading #{anchor} there")
        for text, in_code_span in [
            *((span, True) for span in markdown.code_spans()),
            (markdown.fenced, False),
        ]:
            for token in path_tokens(text):
                named = repository_path(token, repo, in_code_span)
                if named is not None and not named.exists():
                    problems.append(f"{name}: `{token}` names no file of the repository")
    return problems


def test_every_link_anchor_and_path_of_the_docs_resolves() -> None:
    assert (REPO / "docs").is_dir()
    problems = broken(docs())
    assert not problems, "\n".join(problems)


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert readme.count("\n") <= 300
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"README.md does not point at docs/{page.name}"


def test_the_layout_is_written_once() -> None:
    # The package's tree is described in docs/architecture.md and nowhere else.
    holders = [
        path.relative_to(REPO)
        for path in docs()
        if any(h.startswith("Layout") for h in Markdown.read(path).headings)
    ]
    assert holders == [Path("docs/architecture.md")]


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Checking a real GPU node: `hack/gpu-check`", "checking-a-real-gpu-node-hackgpu-check"),
        ("The test kit: `dra_gpu.testing`", "the-test-kit-dra_gputesting"),
        ("Controller at scale (`make bench`)", "controller-at-scale-make-bench"),
        (
            "DraGpuDeviceFatal and DraGpuDeviceDegraded",
            "dragpudevicefatal-and-dragpudevicedegraded",
        ),
        ("1,000 \u00d7 8 \u2014 before \u2192 after", "1000--8--before--after"),
    ],
)
def test_anchors_follow_githubs_slug_rule(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_a_broken_link_anchor_or_path_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "here.py").write_text("")
    (tmp_path / "docs" / "a.md").write_text(
        "# A\n\n## Twice\n\n## Twice\n\n"
        "[ok](../README.md#readme) [ok](#twice-1) [ok](a.md#a) [web](https://example.invalid/x)\n"
        "`tests/here.py` `tests/<area>/` `tests/unit/*.py` and [`not a link`](#a)\n"
        "[gone](missing.md) [no anchor](#thrice) [out](../../elsewhere.md)\n"
        "`tests/gone.py` and `tests/here.py::test_x`\n"
        "```sh\nrun hack/gone.sh   # a heading-like line:\n# not a heading\n```\n"
    )
    (tmp_path / "README.md").write_text(
        "# README\n\n[docs](docs/a.md#twice) [bad](docs/a.md#not-a-heading)\n"
    )
    (tmp_path / "operator" / "dra_gpu" / "agent").mkdir(parents=True)
    (tmp_path / "operator" / "dra_gpu" / "agent" / "__init__.py").write_text("")
    (tmp_path / "operator" / "dra_gpu" / "exits.py").write_text("")
    (tmp_path / "docs" / "b.md").write_text(
        "`agent/` `dra_gpu/exits.py` `agent/__init__.py` `nope/x.py` `resource.k8s.io/v1`\n"
        "`agent/gone.py` and `dra_gpu/gone.py` (in a code span only)\n"
        "```\nagent/also_gone.py\n```\n"
    )
    found = broken(docs(tmp_path), tmp_path)
    assert found == [
        "README.md: link docs/a.md#not-a-heading: no heading #not-a-heading there",
        "docs/a.md: link missing.md: no docs/missing.md",
        "docs/a.md: link #thrice: no heading #thrice there",
        "docs/a.md: link ../../elsewhere.md leaves the repository",
        "docs/a.md: `tests/gone.py` names no file of the repository",
        "docs/a.md: `hack/gone.sh` names no file of the repository",
        "docs/b.md: `agent/gone.py` names no file of the repository",
        "docs/b.md: `dra_gpu/gone.py` names no file of the repository",
    ]
