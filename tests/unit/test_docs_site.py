"""The documentation: the README stays short and points into docs/, the MkDocs site builds with
--strict (a broken link or anchor fails), and its configuration reference is generated from the
settings tree, every key of it."""
from __future__ import annotations

import dataclasses
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from settings.tree import SECTIONS, Config, ListenerConfig

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"   # installed by scripts/setup.sh (requirements-dev.txt)
PAGES = ["index.md", "getting-started.md", "operations.md", "configuration.md", "history.md",
         "rules.md", "cluster.md", "security.md", "deployment.md", "performance.md",
         "architecture.md", "conformance.md"]


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    assert MKDOCS.exists(), f"{MKDOCS} is missing: scripts/setup.sh installs it (requirements-dev.txt)"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def every_key() -> list[tuple[str, str]]:
    """(table, key) of every field of the settings tree."""
    tables = [("broker", Config), *SECTIONS.items(), ("listeners", ListenerConfig)]
    return [(name, f.name) for name, cls in tables for f in dataclasses.fields(cls)
            if "section" not in f.metadata]


def test_the_site_builds_strictly(site):
    """`mkdocs build --strict` succeeds: every page of the nav is written."""
    for page in PAGES:
        out = site / ("index.html" if page == "index.md" else page[:-3] + "/index.html")
        assert out.exists(), f"{page} was not built"


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The strict build is a check: a link to a page that does not exist, or to an anchor a page
    does not have, fails it (else the build above would pass for nothing)."""
    for n, (bad, said) in enumerate([("[gone](no-such-page.md)", "no-such-page.md"),
                                     ("[gone](cluster.md#no-such-heading)", "no-such-heading")]):
        copy = tmp_path / str(n)
        shutil.copytree(ROOT / "docs", copy / "docs")
        shutil.copytree(ROOT / "scripts", copy / "scripts")
        (copy / "config").mkdir()
        shutil.copy(ROOT / "config/broker.toml", copy / "config/broker.toml")
        shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
        page = copy / "docs/rules.md"
        page.write_text(page.read_text() + f"\nSee {bad}.\n")
        done = build(copy / "mkdocs.yml", copy / "site")
        assert done.returncode != 0, f"a strict build with {bad} passed"
        assert said in done.stderr and "WARNING" in done.stderr, done.stderr[-2000:]


def test_the_configuration_reference_names_every_key(site):
    """docs/configuration.md's reference, as built: a row (and an anchor) for every key of the
    tree, with its default."""
    text = (site / "configuration/index.html").read_text()
    missing = [f"{t}.{k}" for t, k in every_key() if f'id="{t}-{k}"' not in text]
    assert missing == []
    row = re.search(r'id="mqtt-receive_maximum".*?</li>', text, re.S)
    assert row and "1024" in row.group(0) and "from 1 to 65535" in html.unescape(row.group(0))


def test_the_generated_reference_follows_the_tree(monkeypatch):
    """The page is made from the tree, not copied: a field added to the tree is on it, with its
    default and what it accepts, and its description comes from config/broker.toml."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import settings_reference as ref
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    page = ref.render()
    assert [f"{t}.{k}" for t, k in every_key() if f'<span id="{t}-{k}">' not in page] == []
    assert "**`mqtt.max_sessions`** = `100000`  \n  *int: a whole number" in page

    @dataclasses.dataclass(slots=True)
    class Extra(SECTIONS["metrics"]):      # type: ignore[misc,valid-type]
        TABLE = "metrics"
        scrape_timeout: float = 7.5
    monkeypatch.setitem(SECTIONS, "metrics", Extra)
    toml = (ROOT / "config/broker.toml").read_text().replace(
        "[metrics]\n", "[metrics]\nscrape_timeout = 7.5   # seconds a scrape may take\n")
    lines = ref.render(toml).splitlines()
    at = next(n for n, line in enumerate(lines) if 'id="metrics-scrape_timeout"' in line)
    row = lines[at] + lines[at + 1]
    assert "`7.5`" in row and "a number &gt;= 0" in row and "seconds a scrape may take" in row


def test_the_readme_is_short_and_links_into_the_pages(site):
    """The README keeps what the product is, the two commands, a first message and query, and
    links to the pages; every link to docs/ names a page and an anchor that the site has."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    for needed in ("bash scripts/run.sh", "bash scripts/test.sh", "mosquitto_pub -t",
                   "python -m sink.query", "mkdocs serve", "mkdocs build"):
        assert needed in readme, needed
    links = re.findall(r"\]\(docs/([\w-]+\.md)(?:#([\w-]+))?\)", readme)
    assert {page for page, _ in links} >= set(PAGES) - {"index.md"}
    for page, anchor in links:
        built = (site / page[:-3] / "index.html").read_text()
        assert not anchor or f'id="{anchor}"' in built, f"README links to docs/{page}#{anchor}"


def test_the_nav_lists_every_page():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md")) == sorted(PAGES)
    assert [p for p in PAGES if f": {p}" not in nav] == []


def test_every_list_item_is_rendered_as_one(site):
    """A list that GitHub shows but Python-Markdown reads as text (an item right after a
    paragraph, a nested list indented by two spaces) shows on the site as '- ...' lines:
    none does."""
    bad = []
    for page in PAGES:
        built = site / ("index.html" if page == "index.md" else page[:-3] + "/index.html")
        text = built.read_text()
        body = re.sub(r"<pre.*?</pre>", "", text[text.index("<article"):text.index("</article>")],
                      flags=re.S)
        bad += [f"{page}: {m.group(0).strip()[:60]}" for m in re.finditer(r"\n\s*(?:-|\d+\.) .*", body)]
    assert bad == []
