"""The tree executor's pure core: nodes, runs, think/tool/collapse steps, typed events.

Never imports opentelemetry, duckdb, pandas, streamlit or rich (an import-linter
contract checks it). Telemetry is one observer among several.
"""
