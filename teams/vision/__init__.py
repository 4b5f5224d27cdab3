"""The vision team's code location: its pipelines, built only from the platform's public API."""
