"""Shared test helpers, imported as ``from _support import ...`` (``tests/`` is on pytest's
``pythonpath``). One module per area; session-scoped fixtures that several test folders use
are defined here and re-exported by the folder's ``conftest.py``."""
