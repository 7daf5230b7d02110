"""``python -m sink.query "SQL"``: Spark SQL over the history table (view ``messages``).

The command's home; the code is sink/history/query.py. From Python: ``sink.query.run_sql``.
"""
import sys

from sink.history.query import main, run_sql  # noqa: F401  (run_sql: the documented API)

if __name__ == "__main__":
    sys.exit(main())
