"""fuzz.judge: see docs/architecture.md."""
