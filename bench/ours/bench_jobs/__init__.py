"""The benchmark's own workflows (see workflows.py)."""
