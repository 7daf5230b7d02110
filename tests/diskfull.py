"""A real small filesystem that tests can fill up (disk full) and free again.

A tmpfs mounted on a test directory: writes past its size fail with ENOSPC, for real, in
any process. Mounting needs root (CAP_SYS_ADMIN); without it the test is skipped and says why.
"""
from __future__ import annotations

import errno
import os
import subprocess

import pytest


class SmallFS:
    def __init__(self, path, size: str = "2m"):
        self.path = str(path)
        os.makedirs(self.path, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", self.path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {r.stderr.strip()}")
        self.filler = os.path.join(self.path, "filler")

    def fill(self) -> None:
        """Take every free byte: the next write that needs a new page fails with ENOSPC."""
        with open(self.filler, "ab", buffering=0) as f:
            chunk = b"\0" * 4096
            try:
                while True:
                    f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc

    def free(self) -> None:
        os.unlink(self.filler)

    def close(self) -> None:
        subprocess.run(["umount", "-l", self.path], capture_output=True)
