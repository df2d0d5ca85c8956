"""The dashboard pages (Streamlit scripts): layout only; they import dashboard.data and dashboard.charts."""
