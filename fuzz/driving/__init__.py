"""fuzz.driving: see docs/architecture.md."""
