"""Unit tests: no server, recorded inputs only."""
