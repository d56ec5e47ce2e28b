"""Operating a running ingest: Prometheus metrics, source health, alerts and the watcher that feeds them."""
