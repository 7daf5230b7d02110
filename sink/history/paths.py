"""Where the history's files live: local paths (the job writes them through its own log,
sink/history/manifest.py) or a remote file system's URIs (hdfs://, s3a://: Spark's file sink)."""
from __future__ import annotations

from pathlib import Path


def is_local_path(path: str) -> bool:
    """A path on this machine (no URI scheme such as hdfs:// or s3a://)."""
    return "://" not in path or path.startswith("file://")


def local(path: str) -> Path:
    return Path(path[len("file://"):] if path.startswith("file://") else path)
