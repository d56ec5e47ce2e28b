"""MongoDB source: change-stream decoding (pure), stream capture and snapshots."""
