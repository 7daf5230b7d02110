"""``python -m sink.history.job``: the same command as ``python -m sink.job``."""
import sys

from sink.history.job.command import cli

if __name__ == "__main__":
    sys.exit(cli())
