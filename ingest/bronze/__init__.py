"""Bronze: append-only Delta tables written by path; knows events, not Postgres or MongoDB."""
