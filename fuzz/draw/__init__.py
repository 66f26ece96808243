"""fuzz.draw: see docs/architecture.md."""
