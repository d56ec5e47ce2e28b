"""The demo workload and the summary printed by `make demo`."""
