"""Reproductions of confirmed defects still open: kept in the tree so the next round starts from
them, never collected with the suite (each fails on main by design). Each file's docstring says
what is wrong, what should happen and why it matters; its name says the issue and review round
(``test_review<ISSUE><round>_<topic>.py``). To run one, move it into tests/ (it imports
tests/support.py) and run ``pytest tests/FILE``; once its fix lands, it stays there.

Not listed here (their docstrings say it all), so that rounds adding and fixers removing
reproductions never edit the same lines."""

collect_ignore_glob = ["test_*.py"]
