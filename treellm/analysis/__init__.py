"""Analysis of stored runs: ``(connection, filters) -> DataFrame`` functions.

Shapes, prune rates, repeat outcomes, what-if replay of limits, tuning candidates and
near repeats. Pure SQL/pandas over a store connection (``treellm.store.open_store`` or
``open_parquet``); never imports the engine or streamlit.
"""
