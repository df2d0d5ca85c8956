"""treellm's Streamlit dashboard: ``app.py`` navigates, ``data.py`` reads the store, ``charts.py``
builds figures, ``pages/`` lay them out. Launched by ``treellm dashboard``."""
