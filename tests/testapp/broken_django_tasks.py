"""A task module that fails at import: a run naming one of its tasks fails with a clear error."""

raise RuntimeError("this module is broken on purpose")
