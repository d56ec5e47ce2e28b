"""Change sources: one subpackage per source database."""
