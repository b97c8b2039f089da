"""Reproductions of confirmed defects still open (issues 34 and 35, reviews 34c and 35c): kept
in the tree so the next round starts from them, never collected with the suite (each fails on
main by design). To run one, move it into tests/ (it imports tests/support.py) and run
`pytest tests/FILE`; once its fix lands, it stays there."""

collect_ignore_glob = ["test_*.py"]
