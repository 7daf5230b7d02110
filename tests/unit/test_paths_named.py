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
