"""``python -m sink.job``: the history job (Kafka -> Parquet history table).

The command's home; the job itself is the package sink/history/job/ (the Spark-side program of sink/).
Also a main file for spark-submit (deploy/spark-submit.md).
"""
import sys

from sink.history.job import cli

if __name__ == "__main__":
    sys.exit(cli())
