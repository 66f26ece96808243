"""fuzz.results: see docs/architecture.md."""
