"""Unit tests of the change sources."""
