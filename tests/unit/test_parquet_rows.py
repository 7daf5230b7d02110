"""The rows of a Parquet file from its footer (sink/history/parquet_rows.py), as pyarrow reads them,
and the history job's driver kept free of pyarrow, NumPy and pandas while it records a batch."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink.history.parquet_rows import ParquetFooterError, parquet_rows


@pytest.mark.parametrize("rows", [0, 1, 7, 300, 70_000])
@pytest.mark.parametrize("options", [{}, {"compression": "zstd", "row_group_size": 1000},
                                     {"use_dictionary": False, "write_statistics": False}])
def test_rows_are_the_footers_as_pyarrow_reads_them(tmp_path, rows, options):
    table = pa.table({
        "message_id": pa.array([f"id-{i}" for i in range(rows)]),
        "qos": pa.array([i % 3 for i in range(rows)], pa.int8()),
        "retain": pa.array([i % 2 == 0 for i in range(rows)]),
        "tags": pa.array([[i, i + 1] for i in range(rows)], pa.list_(pa.int64())),
        "props": pa.array([{"k": str(i)} for i in range(rows)],
                          pa.map_(pa.string(), pa.string())),
        "nested": pa.array([{"a": i, "b": float(i)} for i in range(rows)]),
    })
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, **options)
    assert parquet_rows(path) == pq.read_metadata(path).num_rows == rows


def test_a_file_that_is_not_parquet_is_refused_with_its_name(tmp_path):
    bad = tmp_path / "not.parquet"
    bad.write_bytes(b"hello, this is no parquet file at all")
    with pytest.raises(ParquetFooterError, match="not.parquet"):
        parquet_rows(bad)


def test_a_cut_footer_is_refused(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), path)
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    cut = tmp_path / "cut.parquet"   # the footer's first half zeroed: no fields to read
    cut.write_bytes(data[:-8 - length] + bytes(length) + data[-8:])
    with pytest.raises(ParquetFooterError):
        parquet_rows(cut)


def test_placing_staged_files_loads_neither_pyarrow_nor_numpy(tmp_path):
    """What the job's driver runs per micro-batch (Table.place) imports no pyarrow: with it, the
    driver loaded NumPy and, through PySpark's converters, pandas (about 130 MB resident)."""
    staged = tmp_path / "stage" / "date=2024-05-01"
    staged.mkdir(parents=True)
    pq.write_table(pa.table({"x": list(range(5))}), staged / "part-0.parquet")
    code = (
        "import sys; from pathlib import Path\n"
        "from sink.history.manifest import Table, staged_files\n"
        f"t = Table({str(tmp_path / 'table')!r})\n"
        f"out = t.place(staged_files(Path({str(tmp_path / 'stage')!r})), 'b', 0, 0)\n"
        "print(out[0].rows, sorted(m for m in ('pyarrow', 'numpy', 'pandas') if m in sys.modules))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[0] == "5 []"
