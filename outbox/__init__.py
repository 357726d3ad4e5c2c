"""Transactional outbox: publish events with your writes, dispatch them exactly once."""
