"""``python -m sink.maintain --table DIR [--as-of TIME]``: compact the history table's closed
partitions and apply its retention now (the code: sink/history/maintenance.py)."""
import sys

from sink.history.maintenance import main

if __name__ == "__main__":
    sys.exit(main())
