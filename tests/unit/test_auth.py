"""broker.auth: password hashing and files, ACL parsing and evaluation, AccessControl, CLI."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.auth import (
    ACL,
    BAD_USER_NAME_OR_PASSWORD,
    NOT_AUTHORIZED,
    AccessControl,
    AuthFileError,
    PasswordFile,
    covers,
    from_config,
    hash_password,
    overlaps,
    verify_password,
)
from broker.auth import passwords as pwmod
from broker.auth.__main__ import main as cli
from mqtt_topics import matches

ROOT = Path(__file__).resolve().parents[2]
FAST = dict(n=2 ** 8, r=8, p=1)   # cheap scrypt parameters for tests


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def write_pw(path: Path, users: dict[str, str]) -> None:
    path.write_text("".join(f"{u}:{hash_password(p, **FAST)}\n" for u, p in users.items()))


def bump(path: Path) -> None:
    """Make sure the file's signature changes even on coarse-mtime filesystems."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


# ------------------------------------------------------------------ hashing
def test_hash_format_and_verify():
    h = hash_password("s3cret")
    parts = h.split("$")
    assert parts[:5] == ["", "scrypt", str(2 ** 14), "8", "1"]
    assert verify_password(h, "s3cret")
    assert verify_password(h, b"s3cret")
    assert not verify_password(h, "s3cret ")
    assert not verify_password(h, "")


def test_hash_is_salted():
    a, b = hash_password("same", **FAST), hash_password("same", **FAST)
    assert a != b
    assert verify_password(a, "same") and verify_password(b, "same")


def test_hash_uses_constant_time_compare(monkeypatch):
    calls = []
    real = pwmod.hmac.compare_digest
    monkeypatch.setattr(pwmod.hmac, "compare_digest", lambda x, y: calls.append(1) or real(x, y))
    assert verify_password(hash_password("x", **FAST), "x")
    assert calls


@pytest.mark.parametrize("bad", ["$scrypt$16384$8$1$c2FsdA==", "$bcrypt$16384$8$1$c2FsdA==$aGFzaA==",
                                 "$scrypt$1000$8$1$c2FsdHNhbHQ=$" + "A" * 44,
                                 "$scrypt$16384$8$1$!!$" + "A" * 44,
                                 "$scrypt$" + str(2 ** 30) + "$8$1$c2FsdA==$" + "A" * 44])
def test_bad_hash_lines_are_reported_with_line(tmp_path, bad):
    f = tmp_path / "pw"
    f.write_text(f"# users\nalice:{hash_password('a', **FAST)}\nbob:{bad}\n")
    with pytest.raises(AuthFileError) as ei:
        PasswordFile(str(f))
    assert f"{f}:3: user 'bob'" in str(ei.value)


def test_password_file_errors(tmp_path):
    f = tmp_path / "pw"
    h = hash_password("a", **FAST)
    f.write_text(f"alice:{h}\nno colon here\nalice:{h}\n")
    with pytest.raises(AuthFileError) as ei:
        PasswordFile(str(f))
    assert ei.value.errors == [f"{f}:2: expected USER:$scrypt$N$R$P$SALT$HASH (or "
                               "mosquitto_passwd's USER:$7$ITERATIONS$SALT$HASH)",
                               f"{f}:3: user 'alice' appears twice"]
    with pytest.raises(AuthFileError, match="not found"):
        PasswordFile(str(tmp_path / "missing"))


# A line mosquitto_passwd (Mosquitto 2.0.11) wrote for alice, password "secret pass": PBKDF2-SHA512,
# 101 iterations, 12-byte salt, 64-byte hash
MOSQUITTO_LINE = ("alice:$7$101$TdVRFAKHpEvdZwmA$zYG8XlKRbNhugXR/aoDyiee2ZzO4PQJltUeI5HR1Fv2P36LBoep2"
                  "/IGUVLBlggWUuyRcJtqnCs+OIeLXDHWL0w==")


def test_mosquitto_pbkdf2_sha512_hash_is_accepted(tmp_path):
    """A Mosquitto 2 password file ($7$: PBKDF2-HMAC-SHA512, mosquitto_passwd's format) works as
    it is, beside scrypt lines; the fixed vector was made by Debian's mosquitto_passwd."""
    f = tmp_path / "pw"
    f.write_text(MOSQUITTO_LINE + f"\nbob:{hash_password('builder', **FAST)}\n")
    pf = PasswordFile(str(f), cache_seconds=0)
    assert pf.check("alice", b"secret pass") and pf.check("bob", b"builder")
    assert not pf.check("alice", b"secret pass ") and not pf.check("alice", None)
    assert verify_password(MOSQUITTO_LINE.partition(":")[2], "secret pass")


def test_hash_made_by_mosquitto_passwd_is_accepted(tmp_path):
    """The same with a file mosquitto_passwd writes now (installed by scripts/setup.sh with the
    mosquitto package), with its default and a chosen iteration count."""
    import shutil
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        pytest.skip("mosquitto_passwd is not installed (scripts/setup.sh installs the mosquitto "
                    "package); the fixed vector test covers the format")
    f = tmp_path / "pw"
    subprocess.run([tool, "-c", "-b", str(f), "carol", "pässword 1"], check=True)
    subprocess.run([tool, "-b", "-I", "1000", str(f), "dave", "x"], check=True)
    text = f.read_text()
    assert "carol:$7$101$" in text and "dave:$7$1000$" in text, text
    pf = PasswordFile(str(f), cache_seconds=0)
    assert pf.check("carol", "pässword 1".encode()) and pf.check("dave", b"x")
    assert not pf.check("carol", b"x") and not pf.check("nobody", b"x")


@pytest.mark.parametrize("bad,why", [
    ("$7$0$TdVRFAKHpEvdZwmA$" + "A" * 88, "between 1 and"),
    ("$7$x$TdVRFAKHpEvdZwmA$" + "A" * 88, "must be an integer"),
    ("$7$101$!!$" + "A" * 88, "base64"),
    ("$6$c2FsdA==$" + "A" * 88, "$6$ hashes (Mosquitto 1.x"),
])
def test_bad_mosquitto_hash_lines_are_reported(tmp_path, bad, why):
    f = tmp_path / "pw"
    f.write_text(f"alice:{bad}\n")
    with pytest.raises(AuthFileError) as ei:
        PasswordFile(str(f))
    assert f"{f}:1: user 'alice'" in str(ei.value) and why in str(ei.value)


def test_unknown_user_costs_what_the_files_users_cost(tmp_path, monkeypatch):
    """With mosquitto_passwd lines, an unknown user is checked against a PBKDF2 hash of the same
    iteration count, not scrypt: how long a refusal takes does not tell which users exist."""
    f = tmp_path / "pw"
    f.write_text(MOSQUITTO_LINE + "\n")
    pf = PasswordFile(str(f), cache_seconds=0)
    calls = []
    real = pwmod.hashlib.pbkdf2_hmac
    monkeypatch.setattr(pwmod.hashlib, "pbkdf2_hmac",
                        lambda *a, **k: calls.append(a[0:1] + a[3:4]) or real(*a, **k))
    monkeypatch.setattr(pwmod, "_scrypt", lambda *a, **k: pytest.fail("scrypt for a $7$ file"))
    assert not pf.check("nobody", b"x")
    assert calls == [("sha512", 101)]


# ------------------------------------------------------------------ password file
def test_password_file_check(tmp_path):
    f = tmp_path / "pw"
    write_pw(f, {"alice": "wonderland", "bob": "builder"})
    pf = PasswordFile(str(f), cache_seconds=0)
    assert pf.check("alice", b"wonderland")
    assert pf.check("bob", b"builder")
    assert not pf.check("alice", b"builder")          # wrong password
    assert not pf.check("alice", None)                # no password
    assert not pf.check("carol", b"wonderland")       # unknown user


def test_unknown_user_checks_dummy_hash(tmp_path, monkeypatch):
    f = tmp_path / "pw"
    write_pw(f, {"alice": "a"})
    pf = PasswordFile(str(f), cache_seconds=0)
    seen = []
    real = pwmod._scrypt
    monkeypatch.setattr(pwmod, "_scrypt", lambda *a, **k: seen.append(a[2]) or real(*a, **k))
    assert not pf.check("nobody", b"x")
    assert seen == [FAST["n"]]           # the same work as the file's users: timing tells nothing


def test_password_file_reload_on_change(tmp_path):
    f = tmp_path / "pw"
    write_pw(f, {"alice": "one"})
    clock = FakeClock()
    pf = PasswordFile(str(f), reload_interval=2.0, clock=clock)
    assert pf.check("alice", b"one")
    write_pw(f, {"alice": "two", "bob": "b"})
    bump(f)
    clock.t += 1.0                       # not yet time to look at the file
    assert pf.check("alice", b"one")     # (cached, and not re-read)
    clock.t += 1.5
    assert not pf.check("alice", b"one")  # re-read: cache cleared, new password
    assert pf.check("alice", b"two") and pf.check("bob", b"b")
    assert pf.reloads == 1


def test_password_file_broken_reload_keeps_users(tmp_path, caplog):
    f = tmp_path / "pw"
    write_pw(f, {"alice": "one"})
    clock = FakeClock()
    pf = PasswordFile(str(f), reload_interval=0, clock=clock)
    f.write_text("alice\n")
    bump(f)
    with caplog.at_level("ERROR", logger="broker.auth"):
        assert pf.check("alice", b"one")
    assert f"{f}:1: expected USER" in caplog.text
    f.unlink()
    assert pf.check("alice", b"one")


def test_cache_avoids_scrypt_and_expires(tmp_path, monkeypatch):
    f = tmp_path / "pw"
    write_pw(f, {"alice": "one"})
    clock = FakeClock()
    pf = PasswordFile(str(f), reload_interval=1e9, cache_seconds=60, clock=clock)
    count = []
    real = pwmod._scrypt
    monkeypatch.setattr(pwmod, "_scrypt", lambda *a, **k: count.append(1) or real(*a, **k))
    for _ in range(5):
        assert pf.check("alice", b"one")
        assert not pf.check("alice", b"bad")
    assert len(count) == 2
    assert not pf.check("alice", b"other")          # a new guess always costs a scrypt
    assert len(count) == 3
    # keys are HMACs: no password or user name in the cache
    for k in pf._cache:
        assert isinstance(k, bytes) and b"one" not in k and b"alice" not in k
    clock.t += 61
    assert pf.check("alice", b"one")
    assert len(count) == 4
    # None and b"" are different cache entries
    assert not pf.check("alice", None)


def test_cache_bounded(tmp_path):
    f = tmp_path / "pw"
    write_pw(f, {"alice": "one"})
    pf = PasswordFile(str(f), cache_max_entries=3)
    for i in range(10):
        pf._cache[bytes([i])] = (pf.clock() + 100, True)
        if len(pf._cache) >= pf.cache_max_entries:
            pf._evict()
    assert len(pf._cache) <= 3


def test_set_and_delete_user_keep_other_lines(tmp_path):
    f = tmp_path / "pw"
    f.write_text("# team\n")
    assert pwmod.set_user(str(f), "alice", "a", **FAST) is True
    assert pwmod.set_user(str(f), "bob", "b", **FAST) is True
    assert pwmod.set_user(str(f), "alice", "a2", **FAST) is False
    text = f.read_text()
    assert text.startswith("# team\nalice:$scrypt$256$8$1$")
    users = pwmod.read_password_file(str(f))
    assert list(users) == ["alice", "bob"]
    assert users["alice"].verify(b"a2")
    assert pwmod.delete_user(str(f), "alice")
    assert not pwmod.delete_user(str(f), "alice")
    assert list(pwmod.read_password_file(str(f))) == ["bob"]
    with pytest.raises(ValueError, match=":"):
        pwmod.set_user(str(f), "a:b", "x", **FAST)


def test_new_password_file_is_private(tmp_path):
    f = tmp_path / "new"
    pwmod.set_user(str(f), "alice", "a", **FAST)
    assert (f.stat().st_mode & 0o777) == 0o600


# ------------------------------------------------------------------ ACL: coverage helpers
@pytest.mark.parametrize("acl,sub,ok", [
    ("a/#", "a/+/b", True), ("a/#", "a/#", True), ("a/#", "a", True), ("a/#", "a/b/c", True),
    ("a/+", "a/#", False), ("a/+", "a/b", True), ("a/+", "a/+", True), ("a/+", "a/b/c", False),
    ("a/+/c", "a/+/c", True), ("a/+/c", "a/b/+", False), ("a/b", "a/+", False),
    ("#", "x/y", True), ("#", "#", True), ("#", "$SYS/x", False), ("+/x", "$SYS/x", False),
    ("$SYS/#", "$SYS/broker/x", True), ("a/b/#", "a", False), ("a/b/#", "a/b", True),
    ("a/b/#", "a/#", False), ("+", "a", True), ("+", "+", True), ("+", "#", False),
    ("a", "a", True), ("a", "b", False), ("a/+/#", "a/#", False),
])
def test_covers(acl, sub, ok):
    assert covers(acl, sub) is ok


def test_covers_agrees_with_matches():
    """covers(A, S) implies every sample topic matched by S is matched by A."""
    filters = ["#", "+", "a", "a/#", "a/+", "a/b", "a/+/c", "a/b/#", "+/b", "+/+", "a/+/#",
               "$SYS/#", "+/#"]
    topics = ["a", "b", "a/b", "a/c", "a/b/c", "a/x/c", "x/b", "a/b/c/d", "$SYS/x", "$SYS", "a/"]
    for A in filters:
        for S in filters:
            if covers(A, S):
                for t in topics:
                    if matches(S, t):
                        assert matches(A, t), (A, S, t)


@pytest.mark.parametrize("f1,f2,ok", [
    ("a/secret", "a/#", True), ("a/secret", "a/+", True), ("a/secret", "a/public", False),
    ("a/#", "a", True), ("a/+", "a", False), ("#", "$SYS/x", False), ("$SYS/#", "#", False),
    ("a/+/c", "a/b/+", True), ("a/b", "a/b/c", False), ("+/+", "a/#", True), ("x/#", "y/#", False),
])
def test_overlaps(f1, f2, ok):
    assert overlaps(f1, f2) is ok
    assert overlaps(f2, f1) is ok


# ------------------------------------------------------------------ ACL parsing + evaluation
ACL_TEXT = """\
# anonymous clients
topic read public/#

user alice
topic readwrite sensors/alice/#
topic read sensors/#
topic deny sensors/secret/#
topic write  with space/x

user admin
topic #

pattern readwrite devices/%u/#
pattern read clients/%c/inbox
pattern write status/%c
"""


@pytest.fixture
def acl():
    return ACL.parse(ACL_TEXT, "acl.conf")


def test_acl_parse_structure(acl):
    assert [(r.access, r.filter) for r in acl.anonymous] == [(1, "public/#")]
    assert [(r.access, r.filter) for r in acl.users["alice"]] == [
        (3, "sensors/alice/#"), (1, "sensors/#"), (4, "sensors/secret/#"), (2, "with space/x")]
    assert [(r.access, r.filter) for r in acl.users["admin"]] == [(3, "#")]
    assert len(acl.patterns) == 3


def test_acl_parse_errors_name_file_and_line():
    text = "user\ntopic read\ntopic read a/#/b\nfrobnicate x\ntopic a/%u\npattern readwrite x+/%u\n"
    with pytest.raises(AuthFileError) as ei:
        ACL.parse(text, "acl.conf")
    errs = ei.value.errors
    assert [e.split(":")[1] for e in errs] == ["1", "2", "3", "4", "5", "6"]
    assert "needs a user name" in errs[0]
    assert "needs a topic filter" in errs[1]
    assert "not a valid topic filter" in errs[2]
    assert "unknown directive 'frobnicate'" in errs[3]
    assert "only substituted in 'pattern'" in errs[4]


@pytest.mark.parametrize("line,wanted", [
    ("topic wrte sensors/#", "unknown access 'wrte' (did you mean 'write'?)"),
    ("pattern raed devices/%u/#", "unknown access 'raed' (did you mean 'read'?)"),
    ("topic denny a/b", "unknown access 'denny' (did you mean 'deny'?)"),
    ("topc read a/b", "unknown directive 'topc' (did you mean 'topic'?)"),
    ("users alice", "unknown directive 'users' (did you mean 'user'?)"),
])
def test_acl_typos_are_errors_with_their_line(line, wanted):
    """A misspelt access word or directive is an error naming the file and line, never a rule
    (before, 'topic wrte sensors/#' granted readwrite on the topic 'wrte sensors/#')."""
    with pytest.raises(AuthFileError) as ei:
        ACL.parse(f"user alice\ntopic read ok/#\n{line}\n", "acl.conf")
    assert ei.value.errors == [ei.value.errors[0]] and ei.value.errors[0].startswith("acl.conf:3: ")
    assert wanted in ei.value.errors[0], ei.value.errors


def test_acl_filter_with_spaces_needs_the_access_word():
    """A filter with spaces is still possible, with its access word; one word alone is a filter."""
    acl = ACL.parse("topic readwrite my topic/#\ntopic single\n", "acl.conf")
    assert [(r.access, r.filter) for r in acl.anonymous] == [(3, "my topic/#"), (3, "single")]


def test_acl_write(acl):
    w = acl.can_write
    assert w("c1", "alice", "sensors/alice/temp")
    assert not w("c1", "alice", "sensors/bob/temp")       # read only
    assert not w("c1", "alice", "public/x")               # anonymous rules are not alice's
    assert w("c1", "alice", "with space/x")
    assert w("c1", "admin", "anything/at/all")
    assert not w("c1", "admin", "$SYS/x")                 # '#' does not reach $ topics
    assert not w("c1", None, "public/x")                  # anonymous: read only
    assert not w("c1", "mallory", "sensors/alice/temp")   # no section: patterns only


def test_acl_deny_wins(acl):
    assert not acl.can_write("c1", "alice", "sensors/secret/alice")
    assert not acl.can_subscribe("c1", "alice", "sensors/secret/x")
    # a deny rule that only overlaps a filter does not refuse it: checked per message instead
    assert acl.can_subscribe("c1", "alice", "sensors/#")
    assert acl.needs_read_check("c1", "alice", "sensors/#")
    assert acl.can_subscribe("c1", "alice", "sensors/+/x")      # may match sensors/secret/x
    assert acl.needs_read_check("c1", "alice", "sensors/+/x")
    assert not acl.can_read("c1", "alice", "sensors/secret/x")
    assert acl.can_read("c1", "alice", "sensors/public/x")
    assert acl.can_subscribe("c1", "alice", "sensors/public/#")
    assert not acl.needs_read_check("c1", "alice", "sensors/public/#")
    assert not acl.can_subscribe("c1", "alice", "sensors/secret/#")   # every topic denied
    acl2 = ACL.parse("user u\ntopic readwrite a/#\ntopic deny a/x\n")
    assert not acl2.can_write("c", "u", "a/x")
    assert acl2.can_write("c", "u", "a/y")


def test_acl_subscription_coverage(acl):
    s = acl.can_subscribe
    assert s("c1", "alice", "sensors/alice/#")
    assert s("c1", "alice", "sensors/+/temp")              # sensors/secret/temp filtered later
    assert ACL.parse("user u\ntopic read sensors/#\n").can_subscribe("c", "u", "sensors/+/temp")
    assert s("c1", "alice", "sensors/bob")
    assert not s("c1", "alice", "#")
    assert not s("c1", "alice", "with space/x")            # write only
    assert s("c1", None, "public/+/b")
    assert not s("c1", None, "+/x")
    assert s("c1", "admin", "#") and s("c1", "admin", "a/+/b")
    assert not s("c1", "admin", "$SYS/#")
    assert s("c1", "admin", "$share/g/a/b")                # shared: the inner filter counts
    assert not s("c1", None, "$share/g/private/x")
    assert s("c1", None, "$share/g/public/x")
    acl2 = ACL.parse("topic read a/+\n")
    assert not acl2.can_subscribe("c", None, "a/#")
    assert acl2.can_subscribe("c", None, "a/+")


def test_acl_patterns_substitute_user_and_client(acl):
    assert acl.can_write("c1", "alice", "devices/alice/cmd")
    assert acl.can_write("c1", "alice", "devices/alice")        # devices/alice/# covers the parent
    assert not acl.can_write("c1", "alice", "devices/bob/cmd")
    assert acl.can_write("c1", "bob", "devices/bob/cmd")
    assert not acl.can_write("c1", None, "devices/alice/cmd")    # %u: no user, no rule
    assert acl.can_subscribe("dev-7", None, "clients/dev-7/inbox")
    assert not acl.can_subscribe("dev-7", None, "clients/dev-8/inbox")
    assert not acl.can_subscribe("dev-7", None, "clients/+/inbox")
    assert acl.can_write("dev-7", None, "status/dev-7")


@pytest.mark.parametrize("name", ["+", "#", "a/b", "x+"])
def test_acl_patterns_skip_wildcard_names(acl, name):
    # user "+" must not turn devices/%u/# into devices/+/#
    assert not acl.can_write("c1", name, "devices/bob/cmd")
    assert not acl.can_subscribe(name, None, "clients/x/inbox")
    assert not acl.can_subscribe(name, None, f"clients/{name}/inbox")


# ------------------------------------------------------------------ AccessControl
def make_files(tmp_path: Path) -> tuple[str, str]:
    pw = tmp_path / "passwd"
    write_pw(pw, {"alice": "wonderland", "admin": "root"})
    acl = tmp_path / "acl"
    acl.write_text(ACL_TEXT)
    return str(pw), str(acl)


def test_access_control_authenticate(tmp_path):
    pw, acl = make_files(tmp_path)
    ac = AccessControl(password_file=pw, acl_file=acl)
    assert ac.allow_anonymous is False                        # default with a password file
    assert ac.authenticate("c", "alice", b"wonderland") == 0
    assert ac.authenticate("c", "alice", b"nope") == BAD_USER_NAME_OR_PASSWORD
    assert ac.authenticate("c", "alice", None) == BAD_USER_NAME_OR_PASSWORD
    assert ac.authenticate("c", "nobody", b"x") == BAD_USER_NAME_OR_PASSWORD
    assert ac.authenticate("c", None, None) == NOT_AUTHORIZED
    assert ac.authenticate("c", None, b"wonderland") == NOT_AUTHORIZED
    ac2 = AccessControl(password_file=pw, allow_anonymous=True)
    assert ac2.authenticate("c", None, None) == 0
    assert ac2.authenticate("c", "alice", b"nope") == BAD_USER_NAME_OR_PASSWORD


def test_access_control_anonymous_and_no_acl(tmp_path):
    ac = AccessControl()
    assert ac.allow_anonymous is True
    assert ac.authenticate("c", None, None) == 0
    assert ac.authenticate("c", "whoever", b"x") == 0      # nothing to check against
    assert ac.allow_publish("c", None, "any/topic") and ac.allow_subscribe("c", None, "#")
    with pytest.raises(ValueError, match="needs auth.password_file"):
        AccessControl(allow_anonymous=False)


def test_access_control_acl_and_reload(tmp_path):
    pw, acl = make_files(tmp_path)
    clock = FakeClock()
    ac = AccessControl(password_file=pw, acl_file=acl, clock=clock, reload_interval=1.0)
    assert ac.allow_publish("c", "alice", "sensors/alice/t")
    assert not ac.allow_publish("c", "alice", "other/t")
    assert ac.allow_subscribe("c", "alice", "sensors/+/t")            # deny overlaps: granted
    assert ac.needs_read_check("c", "alice", "sensors/+/t")
    assert not ac.allow_read("c", "alice", "sensors/secret/t")        # ... and filtered
    Path(acl).write_text("user alice\ntopic readwrite other/#\n")
    bump(Path(acl))
    assert not ac.allow_publish("c", "alice", "other/t")   # decision cached, not re-checked yet
    clock.t += 1.0
    assert ac.allow_publish("c", "alice", "other/t")
    assert not ac.allow_publish("c", "alice", "sensors/alice/t")
    # a broken file keeps the rules
    Path(acl).write_text("nonsense\n")
    bump(Path(acl))
    clock.t += 1.0
    assert ac.allow_publish("c", "alice", "other/t")
    # explicit reload (SIGHUP)
    Path(acl).write_text("user alice\ntopic readwrite third/#\n")
    ac.reload()
    assert ac.allow_publish("c", "alice", "third/x") and not ac.allow_publish("c", "alice", "other/t")


def test_from_config(tmp_path):
    pw, acl = make_files(tmp_path)
    assert from_config({}) is None
    assert from_config(None) is None
    assert from_config({"allow_anonymous": True}) is None
    ac = from_config({"password_file": pw, "acl_file": acl, "cache_seconds": 0})
    assert isinstance(ac, AccessControl) and not ac.allow_anonymous
    assert ac.passwords.cache_seconds == 0
    assert from_config({"acl_file": acl}).allow_anonymous is True
    with pytest.raises(ValueError, match="auth.passwd_file.*unknown setting"):
        from_config({"passwd_file": pw})
    with pytest.raises(ValueError, match="true or false"):
        from_config({"password_file": pw, "allow_anonymous": "no"})
    with pytest.raises(ValueError, match="needs auth.password_file"):
        from_config({"allow_anonymous": False})
    with pytest.raises(ValueError, match=">= 0"):
        from_config({"password_file": pw, "cache_seconds": -1})
    bad = tmp_path / "bad.acl"
    bad.write_text("topic read ok/#\ntopik read x\n")
    with pytest.raises(ValueError, match=f"{bad}:2: unknown directive 'topik'"):
        from_config({"acl_file": str(bad)})
    with pytest.raises(ValueError, match="not found"):
        from_config({"password_file": str(tmp_path / "missing")})


# ------------------------------------------------------------------ CLI
def test_cli_passwd_add_list_delete(tmp_path, capsys, monkeypatch):
    f = str(tmp_path / "pw")
    assert cli(["passwd", f, "add", "alice", "--password", "a", "--scrypt-n", "256"]) == 0
    answers = iter(["b", "b"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert cli(["passwd", f, "add", "bob", "--scrypt-n", "256"]) == 0
    answers = iter(["x", "y"])
    assert cli(["passwd", f, "add", "carol"]) == 1
    assert "do not match" in capsys.readouterr().err
    assert cli(["passwd", f, "list"]) == 0
    assert capsys.readouterr().out.split() == ["alice", "bob"]
    assert PasswordFile(f).check("bob", b"b")
    assert cli(["passwd", f, "delete", "alice"]) == 0
    assert cli(["passwd", f, "delete", "alice"]) == 1
    assert cli(["passwd", f, "add", "a:b", "--password", "x"]) == 1
    assert "may not contain ':'" in capsys.readouterr().err


def test_cli_check_acl(tmp_path, capsys):
    good = tmp_path / "good"
    good.write_text(ACL_TEXT)
    assert cli(["check-acl", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad"
    bad.write_text("user x\ntopic read a/#/b\n")
    assert cli(["check-acl", str(bad)]) == 1
    assert f"{bad}:2: 'a/#/b' is not a valid topic filter" in capsys.readouterr().err
    typo = tmp_path / "typo"
    typo.write_text("user x\ntopic read a/#\ntopic wrte sensors/#\n")
    assert cli(["check-acl", str(typo)]) == 1
    assert f"{typo}:3: unknown access 'wrte'" in capsys.readouterr().err


def test_cli_help_runs_as_module():
    for args in ([], ["passwd", "f"], ["passwd", "f", "add"], ["passwd", "f", "delete"],
                 ["passwd", "f", "list"], ["check-acl"]):
        r = subprocess.run([sys.executable, "-m", "broker.auth", *args, "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "usage: python -m broker.auth" in r.stdout, (args, r.stderr)
