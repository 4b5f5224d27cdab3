"""Team code locations that live beside the platform in this repository (each could be its own repo)."""
