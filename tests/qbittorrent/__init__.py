"""Tests against real `qbittorrent-nox` instances on loopback (skipped when it is not installed)."""
