"""changelake ingest: source changes (Postgres pgoutput, MongoDB change streams) -> bronze Delta."""
