"""The dashboard pages (Streamlit scripts): layout only; they import dashboard.data, dashboard.charts and
dashboard.text (which says how a string from a trace may be shown)."""
