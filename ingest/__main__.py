"""`python -m ingest` runs the CLI."""

import sys

from ingest.cli import main

sys.exit(main())
