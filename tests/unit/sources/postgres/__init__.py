"""Unit tests of the PostgreSQL source (recorded pgoutput bytes)."""
