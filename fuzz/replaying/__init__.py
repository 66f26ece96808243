"""fuzz.replaying: see docs/architecture.md."""
