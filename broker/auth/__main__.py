"""python -m broker.auth: manage password files and check ACL files.

    python -m broker.auth passwd FILE add USER [--password P]   # prompts twice without --password
    python -m broker.auth passwd FILE delete USER
    python -m broker.auth passwd FILE list
    python -m broker.auth check-acl ACLFILE
"""
from __future__ import annotations

import argparse
import getpass
import sys

from .acl import ACL, AuthFileError
from .passwords import (
    DEFAULT_N,
    DEFAULT_P,
    DEFAULT_R,
    delete_user,
    read_password_file,
    set_user,
    valid_username,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m broker.auth",
        description="Manage the broker's password file and check its ACL file "
                    "(configured in the [auth] table of the broker config).")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    pw = sub.add_parser("passwd", help="add, delete or list users of a password file",
                        description="Edit a password file: one USER:$scrypt$N$R$P$SALT$HASH line "
                                    "per user (mosquitto_passwd's $7$ lines are accepted "
                                    "and kept). The file is replaced atomically and created "
                                    "with mode 0600. A running broker picks changes up by itself "
                                    "within auth.reload_interval seconds.")
    pw.add_argument("file", metavar="FILE", help="the password file")
    ops = pw.add_subparsers(dest="op", metavar="OPERATION", required=True)
    add = ops.add_parser("add", help="add a user or change its password",
                         description="Add USER (or replace its password). Without --password "
                                     "the password is asked twice on the terminal.")
    add.add_argument("user", metavar="USER")
    add.add_argument("--password", metavar="P",
                     help="the password (visible in the process list and shell history: "
                          "prefer the prompt)")
    add.add_argument("--scrypt-n", type=int, default=DEFAULT_N, metavar="N",
                     help=f"scrypt cost, a power of two (default {DEFAULT_N})")
    add.add_argument("--scrypt-r", type=int, default=DEFAULT_R, metavar="R",
                     help=f"scrypt block size (default {DEFAULT_R})")
    add.add_argument("--scrypt-p", type=int, default=DEFAULT_P, metavar="P",
                     help=f"scrypt parallelism (default {DEFAULT_P})")
    dele = ops.add_parser("delete", help="remove a user", description="Remove USER from the file.")
    dele.add_argument("user", metavar="USER")
    ops.add_parser("list", help="list the user names", description="Print the user names, one a line.")

    acl = sub.add_parser("check-acl", help="validate an ACL file",
                         description="Parse an ACL file and report every problem as FILE:LINE: "
                                     "message. Exit status 0 when valid, 1 otherwise.")
    acl.add_argument("file", metavar="ACLFILE", help="the ACL file")
    return p


def _ask_password(user: str) -> str:
    first = getpass.getpass(f"Password for {user}: ")
    second = getpass.getpass("Reenter password: ")
    if first != second:
        raise ValueError("the passwords do not match")
    return first


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check-acl":
            acl = ACL.load(args.file)
            print(f"{args.file}: OK: {acl.summary()}")
            return 0
        if args.op == "add":
            problem = valid_username(args.user)
            if problem:
                raise ValueError(problem)
            password = args.password if args.password is not None else _ask_password(args.user)
            if not password:
                raise ValueError("the password is empty")
            new = set_user(args.file, args.user, password,
                           n=args.scrypt_n, r=args.scrypt_r, p=args.scrypt_p)
            print(f"{'added' if new else 'updated'} user {args.user} in {args.file}")
            return 0
        if args.op == "delete":
            if not delete_user(args.file, args.user):
                print(f"error: user {args.user} is not in {args.file}", file=sys.stderr)
                return 1
            print(f"deleted user {args.user} from {args.file}")
            return 0
        if args.op == "list":
            for name in read_password_file(args.file):
                print(name)
            return 0
    except AuthFileError as exc:
        for e in exc.errors:
            print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, EOFError):
        print(file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
