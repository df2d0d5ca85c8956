"""treellm's DuckDB store: open it, ingest traces into it, export it to Parquet, collect garbage.

``open_store`` is the one place that connects (writers migrate the schema);
``open_parquet`` reads exported Parquet folders with the same tables and views.
"""

from treellm.errors import require_extra

require_extra("treellm.store", "store", "duckdb", "pandas")

from treellm.store.connection import default_db_path, open_parquet, open_store
from treellm.store.exporter import DuckDBSpanExporter
from treellm.store.ingest import BadRecord, FileReport, IngestReport, ingest, ingest_file
from treellm.store.maintenance import GcReport, export_parquet, gc

__all__ = [
    "BadRecord",
    "DuckDBSpanExporter",
    "FileReport",
    "GcReport",
    "IngestReport",
    "default_db_path",
    "export_parquet",
    "gc",
    "ingest",
    "ingest_file",
    "open_parquet",
    "open_store",
]
