"""treellm's DuckDB store: open it, ingest traces into it, export it to Parquet.

Public: ``open_store``, ``open_parquet``, ``ingest``, ``IngestReport``,
``DuckDBSpanExporter``, ``export_parquet``, ``gc``.
"""
