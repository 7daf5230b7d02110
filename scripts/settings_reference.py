"""The configuration reference page, written from the typed settings tree (settings/tree.py).

Every key of every table: its name, type, default and what it accepts come from the tree's
fields and their Specs; its description is the comment beside the key in config/broker.toml
(the file that documents every key, tests/unit/test_settings.py keeps it equal to the tree).
Nothing is copied by hand: a key added to the tree is on the page at the next build.

Two uses:
- a MkDocs hook (mkdocs.yml `hooks:`): `on_page_markdown` replaces the marker line in
  docs/configuration.md with the reference while the site is built;
- `python scripts/settings_reference.py` prints the reference (Markdown) to stdout.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:   # mkdocs loads this file by path, from its own bin directory
    sys.path.insert(0, str(ROOT))

from settings.tree import SECTIONS, Config, ListenerConfig  # noqa: E402

MARKER = "<!-- settings-reference -->"
PAGE = "configuration.md"
TOML = ROOT / "config/broker.toml"


# ---- descriptions: the comments of config/broker.toml ------------------------------------
def _split_comment(text: str) -> tuple[str, str]:
    """(before, comment) at the first '#' outside quotes."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return text[:i], text[i + 1:].strip()
    return text, ""


HEADER = re.compile(r"^#?\s*\[\[?([a-z_.]+)\]?\]\s*(.*)$")
KEY = re.compile(r"^(#\s*)?([a-z_]+)\s*=\s*(.*)$")
CONTINUED = re.compile(r"^#?\s{2,}#\s?(.*)$")     # an indented comment line: the key above goes on
QUOTED_KEY = re.compile(r'^#\s*"[^"]+"\s*=')      # [history.kafka]'s examples: Kafka's own names


def toml_docs(text: str) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """({table: its introduction}, {(table, key): description}) from config/broker.toml's
    comments. A key's description is its inline comment and the indented comment lines under
    it; a key without one takes the comment lines just above it; a commented-out key line
    without a comment is an example. A sub-table ([sink.kafka]) describes its parent's key."""
    intro: dict[str, list[str]] = {}
    docs: dict[tuple[str, str], list[str]] = {}
    table, current, pending = "", None, []    # current: the (table, key) a continuation extends
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            current, pending = None, []
            continue
        m = HEADER.match(line)
        if m and (not line.startswith("#") or "=" not in line):
            name = m.group(1)
            _, comment = _split_comment(m.group(2))
            top, _, sub = name.partition(".")
            table = name
            current = (top, sub) if sub else None
            if sub:
                docs.setdefault((top, sub), []).extend([comment] if comment else [])
            else:
                intro.setdefault(top, []).extend(pending)
            pending = []
            continue
        c = CONTINUED.match(line)
        if c and current is not None:
            docs.setdefault(current, []).append(c.group(1).strip())
            continue
        top, _, sub = table.partition(".")
        if sub:                               # inside a sub-table: Kafka's own option names
            if QUOTED_KEY.match(line) and current is not None:
                _, comment = _split_comment(line.lstrip("#"))
                if comment:
                    docs[current].append(comment)
            else:
                current = None                # an option of Kafka's, documented there
            continue
        k = KEY.match(line)
        if k:
            key, (value, comment) = k.group(2), _split_comment(k.group(3))
            current = (top, key)
            said = docs.setdefault(current, [])
            if comment:
                said.append(comment)
            elif pending:
                said.extend(pending)
            elif k.group(1):                  # "# key = value": an example
                said.append(f"e.g. {key} = {value.strip()};")
            pending = []
            continue
        if line.startswith("#"):              # a comment of its own: the table's, or the next key's
            current = None
            words = line.lstrip("#").strip()
            if not words or re.fullmatch(r"-+.*-+", words):   # "--- behaviour ---"
                continue
            if docs_seen(docs, top):
                pending.append(words)
            else:
                intro.setdefault(top, []).append(words)
    return ({t: " ".join(w for w in ws if w) for t, ws in intro.items()},
            {k: " ".join(w for w in ws if w) for k, ws in docs.items()})


def docs_seen(docs: dict[tuple[str, str], list[str]], table: str) -> bool:
    return any(t == table for t, _ in docs)


# ---- the tree -----------------------------------------------------------------------------
def tables() -> list[tuple[str, type]]:
    """(TOML table name, Section class) in the file's order: [broker], the tables, [[listeners]]."""
    return [("broker", Config), *SECTIONS.items(), ("listeners", ListenerConfig)]


def keys(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "section" not in f.metadata]


def toml_value(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v._asdict() if hasattr(v, "_asdict") else v)
                               for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def type_name(f: dataclasses.Field) -> str:
    t = str(f.type)
    return {"tuple": "list", "list": "list", "dict": "table", "bool | None": "bool",
            "int | None": "int"}.get(t, t)


def cell(text: str) -> str:
    """Plain text in Markdown: nothing in it is markup or HTML."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def code(text: str) -> str:
    """Text as inline code."""
    ticks = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def render(toml_text: str | None = None) -> str:
    """The reference: a section per TOML table, an entry per key of the tree."""
    intro, docs = toml_docs(TOML.read_text() if toml_text is None else toml_text)
    specs = {name: cls.specs() for name, cls in tables()}
    out = [
        "Every key of the configuration, generated from the typed settings tree "
        "(`settings/tree.py`) when this site is built: the type, default and accepted values "
        "are the tree's; the descriptions are the comments of `config/broker.toml`. "
        "Give a key in a `--config` file, as `--set TABLE.KEY=VALUE`, or as "
        "`MQTT_BROKER_TABLE__KEY` (`MQTT_BROKER_KEY` for [broker] keys).",
        "",
    ]
    for name, cls in tables():
        head = f"[[{name}]]" if name == "listeners" else f"[{name}]"
        out += [f"### {head}", ""]
        doc = "" if cls is Config else (cls.__doc__ or "").strip()
        if doc:
            out += [cell(" ".join(doc.split())), ""]
        if intro.get(name):
            out += [cell(intro[name]), ""]
        obj = cls()
        for f in keys(cls):
            dotted = f.name if name == "broker" else f"{name}.{f.name}"
            accepts = specs[name][f.name].allowed or type_name(f)
            said = docs.get((name, f.name), "")
            out.append(f'- <span id="{name}-{f.name}"></span>**{code(dotted)}** = '
                       f'{code(toml_value(getattr(obj, f.name)))}  ')
            out.append(f"  *{cell(type_name(f))}: {cell(accepts)}.*" + (f" {cell(said)}" if said else ""))
        out.append("")
    return "\n".join(out)


# ---- the MkDocs hook ----------------------------------------------------------------------
def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        from mkdocs.exceptions import PluginError
        raise PluginError(f"docs/{PAGE} lost the line {MARKER} where the settings reference goes")
    return markdown.replace(MARKER, render())


if __name__ == "__main__":
    print(render())
