"""The soak's team package, copied outside the repository as ``soakteam`` (platform.py)."""
