"""Moved to settings/checks.py (the key checks) and settings/tree.py (the keys); re-exported."""
from settings.checks import *  # noqa: F401,F403
from settings.checks import ConfigError, check, one_line, report  # noqa: F401
from settings.tree import sections  # noqa: F401
