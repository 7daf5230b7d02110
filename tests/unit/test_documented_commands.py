"""Every `python -m broker.auth ...` and `python -m broker.admin ...` command that the README, the
documentation (docs/*.md), the shipped configs, the deployment files or a message of the code
prints is one its command line accepts: documentation and error messages cannot drift from the
parsers again."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from broker.admin.__main__ import build_parser as admin_parser
from broker.auth.__main__ import build_parser as auth_parser

ROOT = Path(__file__).resolve().parents[2]
PARSERS = {"broker.auth": auth_parser, "broker.admin": admin_parser}
# `python -m broker.auth passwd FILE add USER`, ended by a backtick, a quote, a parenthesis, a
# comment or the line's end; placeholders in capitals stand for any value
COMMAND = re.compile(r"python -m (broker\.auth|broker\.admin)((?: +[^\s`'\")#;|]+)*)")


def tracked_texts():
    """(file, its text with lines joined): a command wrapped over two lines of a comment, a
    docstring or a string literal split in two is read whole."""
    names = subprocess.run(["git", "ls-files", "--", "*.md", "*.toml", "*.py", "*.sh", "*.yaml",
                            "*.service"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in names:
        if name == "tests/unit/test_documented_commands.py":
            continue
        text = (ROOT / name).read_text()
        text = re.sub(r"\n[ \t]*(?:#+|\*)?[ \t]*", " ", text)   # comment leaders, indentation
        text = re.sub(r"([\"'])[ \t]*\1?[ \t]*\1", "", text)  # "... python -m " "broker..."
        yield name, text


def documented():
    out = set()
    for where, text in tracked_texts():
        for m in COMMAND.finditer(text):
            args = re.sub(r"\[[^\]]*\]", " ", m.group(2))  # optional parts of a usage line
            after = text[m.end():m.end() + 1]
            if not args.split() or after == "|" or "..." in m.group(0):
                continue
            out.add((where, m.group(1), " ".join(args.split())))
    return sorted(out)


def accepts(module: str, args: str) -> str | None:
    """None when the module's parser accepts these arguments, or the first words of them (the
    rest being the sentence the command stands in), or finds only required arguments missing (a
    command named in prose: "`python -m broker.admin users passwd`"); else the parser's words
    ("invalid choice: 'add'", "unrecognized arguments")."""
    words = [a for a in shlex.split(args) if a != "\\"]
    first = None
    for n in range(len(words), 0, -1):
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                PARSERS[module]().parse_args(words[:n])
            return None
        except SystemExit:
            message = said.getvalue().strip().splitlines()[-1] if said.getvalue() else "exit"
            if "arguments are required" in message and n == len(words):
                return None  # a subcommand named whole, its arguments left out
            first = first or message
    return first or "no arguments"


def test_the_commands_are_found():
    """The scan finds the commands people copy (if it found none, the test below would pass
    for nothing)."""
    found = {(m, a.split()[0]) for _, m, a in documented()}
    assert ("broker.auth", "passwd") in found and ("broker.auth", "check-acl") in found
    assert ("broker.admin", "users") in found


@pytest.mark.parametrize("where, module, args", documented(), ids=lambda v: str(v)[:60])
def test_every_documented_command_is_accepted_by_its_parser(where, module, args):
    said = accepts(module, args)
    assert said is None, f"{where}: python -m {module} {args}: {said}"


def test_the_documentation_site_is_scanned():
    """The pages of docs/ (where the README's sections moved) are read like the README: their
    commands are among those checked."""
    pages = {where for where, _ in tracked_texts() if where.startswith("docs/")}
    assert {"docs/security.md", "docs/operations.md", "docs/getting-started.md"} <= pages
    found = {(where, m, a.split()[0]) for where, m, a in documented()}
    assert ("docs/security.md", "broker.auth", "passwd") in found
    assert ("docs/operations.md", "broker.admin", "users") in found


def test_a_wrong_command_is_caught():
    assert "invalid choice: 'add'" in (accepts("broker.auth", "add FILE USER") or "")
    assert "invalid choice" in (accepts("broker.admin", "users passwrd NAME") or "")
    assert accepts("broker.auth", "passwd FILE add USER") is None
