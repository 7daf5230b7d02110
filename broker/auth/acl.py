"""Topic access control lists (ACL) in a mosquitto-like file format.

File format (one directive per line; blank lines and lines starting with '#' are ignored)::

    # lines before the first `user` line apply to anonymous clients (no user name)
    topic read public/#

    user alice                       # following `topic` lines apply to user alice only
    topic readwrite sensors/alice/#
    topic read sensors/#
    topic deny sensors/secret/#

    user admin
    topic #                          # access omitted = readwrite

    pattern readwrite devices/%u/#   # `pattern` lines apply to every client, wherever they are
    pattern read clients/%c/inbox    # %u = user name, %c = client id

Directives:

* ``user NAME`` starts the section of user NAME (the rest of the line, spaces included).
  Several sections for the same name are merged.
* ``topic [read|write|readwrite|deny] FILTER`` grants (or denies) access to the topics matched
  by FILTER (an MQTT topic filter, '+' and '#' allowed; the rest of the line, so it may contain
  spaces). The access word is optional and defaults to readwrite; a line of several words
  whose first is not an access word ('topic wrte a/b') is an error, so a filter with spaces
  needs the access word ('topic readwrite my topic').
* ``pattern [read|write|readwrite|deny] FILTER`` is the same for every client, after replacing
  ``%u`` with the client's user name and ``%c`` with its client id. A pattern with ``%u`` does
  not apply to clients without a user name. A user name / client id containing '/', '+' or '#'
  is never substituted, so it can neither widen nor escape a rule (fail closed): a read/write
  pattern is skipped for that client (user "+" does not get devices/+/#), and a deny pattern
  denies everything below the levels before the placeholder (``pattern deny dev/%c/secret``
  denies ``dev/#`` to client ``a/b``; ``pattern deny %c/#`` denies that client every topic).

Semantics:

* Nothing is allowed unless a rule allows it (once an ACL file is configured).
* The rules for a client are: the anonymous section (``topic`` lines before any ``user``) when
  it has no user name, or its own ``user`` section when it has one, plus every ``pattern``.
  Anonymous rules do NOT apply to clients with a user name.
* ``deny`` wins: a topic matched by a deny rule is neither readable nor writable, whatever
  else allows it.
* PUBLISH to topic T (also a will message) is allowed when a write/readwrite rule matches T and
  no deny rule matches T.
* SUBSCRIBE to filter S is granted when one single read/readwrite rule *covers* S (ACL ``a/#``
  covers ``a/+/b``, ``a/b`` and ``a/#``; ACL ``a/+`` does not cover ``a/#``; ACL ``#`` does not
  cover ``$SYS/#``) and no deny rule covers S. Coverage by several rules together is not
  considered. For shared subscriptions ``$share/GROUP/S`` the check applies to S.
* Deny rules that only overlap S do not refuse it (as Mosquitto): with ``topic readwrite #``
  and ``topic deny a/secret``, SUBSCRIBE ``#`` is granted and ``a/secret`` is filtered out when
  messages are delivered (and retained messages replayed); SUBSCRIBE ``a/secret`` is refused.
  Only such subscriptions pay for the per-message check (one cached lookup per message).
* PUBLISH is checked when a client publishes. An ACL change (reload) applies to new
  publishes and subscriptions, and to the per-message check of existing subscriptions.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable

from mqtt_topics import matches, valid_topic_filter

READ = 1
WRITE = 2
READWRITE = READ | WRITE
DENY = 4
EVERYTHING = 8  # with DENY: the rule matches every topic (a pattern that failed closed)
ACCESS = {"read": READ, "write": WRITE, "readwrite": READWRITE, "deny": DENY}
_FORBIDDEN_IN_SUBST = ("/", "+", "#")


class AuthFileError(ValueError):
    """One or more problems in an auth file; each entry reads 'FILE:LINE: what is wrong'."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


def covers(acl: str, sub: str) -> bool:
    """Whether every topic matched by filter `sub` is matched by filter `acl`."""
    a = acl.split("/")
    s = sub.split("/")
    if a[0] in ("+", "#") and s[0].startswith("$"):  # [MQTT-4.7.2-1]
        return False
    for i, level in enumerate(a):
        if level == "#":
            return True                    # s[:i] is covered and '#' takes anything below
        if i >= len(s):
            return False                   # sub stops earlier: topics acl can't match
        sl = s[i]
        if sl == "#":
            return False                   # sub goes deeper (and shallower) than acl
        if level == "+":
            continue
        if sl == "+" or sl != level:
            return False
    return len(a) == len(s)


def overlaps(f1: str, f2: str) -> bool:
    """Whether some topic name is matched by both filters."""
    a = f1.split("/")
    b = f2.split("/")
    # wildcards in the first level never match topics starting with '$'
    if (a[0] in ("+", "#") and b[0].startswith("$")) or (b[0] in ("+", "#") and a[0].startswith("$")):
        return False
    n = max(len(a), len(b))
    for i in range(n + 1):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x == "#" or y == "#":
            return True                    # 'a/#' also matches 'a', so an ended side is fine
        if x is None or y is None:
            return x is None and y is None
        if x == "+" or y == "+" or x == y:
            continue
        return False
    return True


@dataclass(slots=True)
class Rule:
    access: int
    filter: str
    line: int = 0


@dataclass
class ACL:
    anonymous: list[Rule] = field(default_factory=list)
    users: dict[str, list[Rule]] = field(default_factory=dict)
    patterns: list[Rule] = field(default_factory=list)
    path: str = ""

    # ---------------------------------------------------------------- parsing
    @classmethod
    def parse(cls, text: str, path: str = "<acl>") -> "ACL":
        acl = cls(path=path)
        errors: list[str] = []
        current: list[Rule] = acl.anonymous
        for no, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 1)
            keyword, rest = parts[0], (parts[1].strip() if len(parts) > 1 else "")
            where = f"{path}:{no}"
            if keyword == "user":
                if not rest:
                    errors.append(f"{where}: 'user' needs a user name")
                    continue
                current = acl.users.setdefault(rest, [])
            elif keyword in ("topic", "pattern"):
                words = rest.split(None, 1)
                first = words[0] if words else ""
                if first in ACCESS:
                    access, filt = ACCESS[first], (words[1].strip() if len(words) > 1 else "")
                elif len(words) > 1:  # 'topic wrte a/b': a misspelt access word, never a filter
                    errors.append(f"{where}: unknown access {first!r}{_did_you_mean(first, ACCESS)} "
                                  f"('{keyword} [read|write|readwrite|deny] FILTER'; a filter with "
                                  f"spaces needs the access word: '{keyword} readwrite {rest}')")
                    continue
                else:
                    access, filt = READWRITE, rest
                if not filt:
                    errors.append(f"{where}: '{keyword}' needs a topic filter "
                                  f"('{keyword} [read|write|readwrite|deny] FILTER')")
                    continue
                check = filt.replace("%u", "u").replace("%c", "c") if keyword == "pattern" else filt
                if not valid_topic_filter(check):
                    errors.append(f"{where}: {filt!r} is not a valid topic filter "
                                  "('#' must be last and alone in its level, '+' alone in its level)")
                    continue
                if keyword == "topic" and ("%u" in filt or "%c" in filt):
                    errors.append(f"{where}: %u/%c are only substituted in 'pattern' lines, "
                                  f"not in 'topic' lines")
                    continue
                (current if keyword == "topic" else acl.patterns).append(Rule(access, filt, no))
            else:
                errors.append(f"{where}: unknown directive {keyword!r}"
                              f"{_did_you_mean(keyword, ('user', 'topic', 'pattern'))} "
                              "(expected 'user', 'topic' or 'pattern')")
        if errors:
            raise AuthFileError(errors)
        return acl

    @classmethod
    def load(cls, path: str) -> "ACL":
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise AuthFileError([f"{path}: ACL file not found"]) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthFileError([f"{path}: cannot read the ACL file: {exc}"]) from None
        return cls.parse(text, path)

    # ---------------------------------------------------------------- evaluation
    def rules_for(self, client_id: str, username: str | None) -> list[tuple[int, str]]:
        """The (access, filter) pairs that apply to this client, patterns substituted."""
        out = [(r.access, r.filter) for r in
               (self.anonymous if username is None else self.users.get(username, ()))]
        for r in self.patterns:
            if username is None and "%u" in r.filter:
                continue  # %u rules are for clients with a user name
            f, widened = r.filter, False
            for key, value in (("%u", username), ("%c", client_id)):
                if f is None or key not in f:
                    continue
                if value and not any(ch in value for ch in _FORBIDDEN_IN_SUBST):
                    f = f.replace(key, value)
                else:  # the name would widen or escape the rule: never substituted
                    # (None: nothing left; then widened, and not kept)
                    f, widened = _cut_before(f, key), True  # type: ignore[assignment]
            if not widened:
                out.append((r.access, f))
            elif r.access & DENY:  # fail closed: deny everything the pattern could mean
                out.append((DENY | EVERYTHING, "#") if f is None else (DENY, f))
            # an allow rule is skipped for that client
        return out

    def can_write(self, client_id: str, username: str | None, topic: str) -> bool:
        return self._can(client_id, username, topic, WRITE)

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        """Whether a message on `topic` may be delivered to this client (per-message check)."""
        return self._can(client_id, username, topic, READ)

    def _can(self, client_id: str, username: str | None, topic: str, want: int) -> bool:
        allowed = False
        for access, f in self.rules_for(client_id, username):
            if access & DENY:
                if access & EVERYTHING or matches(f, topic):
                    return False
            elif access & want and not allowed and matches(f, topic):
                allowed = True
        return allowed

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        topic_filter = _inner_filter(topic_filter)
        if not topic_filter:
            return False
        allowed = False
        for access, f in self.rules_for(client_id, username):
            if access & DENY:
                if access & EVERYTHING or covers(f, topic_filter):
                    return False  # every topic S can match is denied (exactly-denied filter)
            elif access & READ and not allowed and covers(f, topic_filter):
                allowed = True
        return allowed

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """Whether a granted subscription may match denied topics: check each message."""
        topic_filter = _inner_filter(topic_filter)
        for access, f in self.rules_for(client_id, username):
            if access & DENY and (access & EVERYTHING or overlaps(f, topic_filter)):
                return True
        return False

    def summary(self) -> str:
        n_topic = len(self.anonymous) + sum(len(v) for v in self.users.values())
        return (f"{len(self.users)} user section(s), {len(self.anonymous)} anonymous rule(s), "
                f"{n_topic} topic rule(s) in all, {len(self.patterns)} pattern(s)")


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    import difflib  # only for a mistake in the file
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _inner_filter(topic_filter: str) -> str:
    """$share/GROUP/S -> S: access to a shared subscription is access to S."""
    if topic_filter.startswith("$share/"):
        return topic_filter[len("$share/"):].partition("/")[2]
    return topic_filter


def _cut_before(f: str, key: str) -> str | None:
    """The pattern cut before its first level holding `key`, ending in '#' (None: nothing left)."""
    levels = f.split("/")
    i = next(i for i, lv in enumerate(levels) if key in lv)
    return "/".join(levels[:i] + ["#"]) if i else None


def file_signature(path: str) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or edited (for reload-on-change)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
