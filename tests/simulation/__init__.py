"""A deterministic simulation of the engine: hypothesis drives the real transitions (issue 12)."""
