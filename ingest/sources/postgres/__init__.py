"""PostgreSQL source: pgoutput decoding, value mapping, slot and stream."""
