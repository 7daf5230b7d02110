"""Every file of this repository that a comment, a docstring or a document names exists: a
module moved or renamed takes its mentions with it (a newcomer follows them)."""
from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("broker", "sink", "cluster", "kafka_client", "settings", "tests", "bench", "scripts",
       "deploy", "config", "docs", "mqtt_topics")
# a path under one of the top folders that ends in a file name with an extension, e.g.
# "sink/forward/forwarder.py" or "deploy/cluster/haproxy.cfg:12"; not a topic ("bench/secret")
PATH = re.compile(r"(?<![\w./<{$-])((?:%s)/[\w./-]*\.[a-z]{1,5})\b" % "|".join(TOP))


def comments_and_docstrings(path: Path):
    """(line, text) of each comment and each string that stands as a statement of its own."""
    before = tokenize.NEWLINE
    for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if t.type == tokenize.COMMENT or (
                t.type == tokenize.STRING and before in (tokenize.INDENT, tokenize.DEDENT,
                                                         tokenize.NEWLINE, tokenize.NL)):
            yield t.start[0], t.string
        if t.type != tokenize.COMMENT:
            before = t.type


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [ROOT / name for name in out]


def texts():
    for f in tracked("*.py"):
        for line, text in comments_and_docstrings(f):
            yield f, line, text
    for f in tracked("*.md"):
        for line, text in enumerate(f.read_text().splitlines(), 1):
            yield f, line, text


def ignored(names: set[str]) -> set[str]:
    """Which of these paths .gitignore covers: what builds and benchmarks write (the compiled
    core's stamp, bench/results/), named before they exist."""
    p = subprocess.run(["git", "check-ignore", "--stdin"], cwd=ROOT, input="\n".join(names),
                       capture_output=True, text=True)
    return set(p.stdout.split())


def missing() -> list[str]:
    out = []
    for f, line, text in texts():
        for name in PATH.findall(text):
            # a path relative to the repository, or to the naming file's folder (deploy's docs)
            if re.search(r"/(?!README)[A-Z_]+\.[a-z]+$", name):
                continue  # a placeholder ("bench/SCRIPT.py"), not a file
            if not (ROOT / name).exists() and not (f.parent / name).exists():
                out.append((f"{f.relative_to(ROOT)}:{line}", name))
    generated = ignored({name for _, name in out}) if out else set()
    return [f"{where} names {name}" for where, name in out if name not in generated]


def test_every_repository_path_named_in_comments_docstrings_and_docs_exists():
    assert missing() == []


def test_the_documentation_site_is_scanned():
    """docs/*.md, where the README's sections moved, is read like the README: every page, and
    the paths it names are among those checked."""
    pages = {f.relative_to(ROOT).as_posix() for f, _, _ in texts()}
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert docs and docs <= pages
    named = {name for f, _, text in texts() if f.parent == ROOT / "docs" for name in PATH.findall(text)}
    assert {"deploy/SCALE.md", "sink/history/manifest.py", "settings/tree.py"} <= named


def test_the_check_finds_a_stale_name(tmp_path):
    """The scan itself: a docstring naming a file that does not exist is reported."""
    mod = tmp_path / "m.py"
    mod.write_text('"""See cluster/sessions.py and broker/core/router.py."""\n# and sink/gone.py\n')
    found = [n for _, _, text in ((mod, ln, t) for ln, t in comments_and_docstrings(mod))
             for n in PATH.findall(text) if not (ROOT / n).exists()]
    assert found == ["cluster/sessions.py", "sink/gone.py"]


# a section named in a comment or a message: README "Cluster", README, "Access control",
# docs/history.md, "Replay over MQTT" (README \"Cluster\" inside a string literal)
SECTION = re.compile(r'(README|docs/[\w-]+\.md),? \\?"([^"\\]+)\\?"')


def sections_of(page: Path) -> set[str]:
    """A page's headings and the bold labels that start its paragraphs and list items."""
    text = page.read_text()
    out = {h.strip() for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    out |= {b.strip().rstrip(".:") for b in re.findall(r"^(?:- )?\s*\*\*([^*]+)\*\*", text, re.MULTILINE)}
    return out


def pointers():
    """(file:line, where, section) of every section pointer in the tracked files."""
    for f in tracked("*.py", "*.md", "*.toml", "*.yaml", "*.cfg", "*.sh", "*.service"):
        if f.name == "test_paths_named.py":
            continue
        for line, text in enumerate(f.read_text().splitlines(), 1):
            for where, name in SECTION.findall(text):
                yield f"{f.relative_to(ROOT)}:{line}", where, name


def stale_sections() -> list[str]:
    everywhere = set().union(*(sections_of(p) for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]))
    out = []
    for at, where, name in pointers():
        known = everywhere if where == "README" else \
            sections_of(ROOT / where) if (ROOT / where).exists() else set()
        if not any(s == name or s.startswith(name) for s in known):
            out.append(f"{at} names {where} \"{name}\"")
    return out


def test_every_section_named_exists():
    """A pointer to a section of the documentation (README "Cluster", docs/history.md, "Replay
    over MQTT") names a heading, or a bold paragraph label, that the README or the pages have:
    sections moved from the README into docs/ keep their names."""
    assert stale_sections() == []


def test_the_section_check_finds_a_stale_name():
    assert ("cluster/node.py", "README", "Cluster") in {(a.split(":")[0], w, n) for a, w, n in pointers()}
    assert SECTION.findall('see README "Clustre" and docs/history.md, "Replay over MQTT"') == [
        ("README", "Clustre"), ("docs/history.md", "Replay over MQTT")]
    assert "Replay over MQTT" in sections_of(ROOT / "docs/history.md")
    assert "Subscription limits" in sections_of(ROOT / "docs/conformance.md")
    assert "Clustre" not in set().union(*(sections_of(p) for p in (ROOT / "docs").glob("*.md")))
