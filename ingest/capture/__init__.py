"""The capture layer every source shares: batching on transaction boundaries, the snapshot worker."""
