"""The relay team's package, copied outside the repository as ``relay`` by
tests/teams/test_elastic_team_gang.py (so nothing of it imports from the repository's tree)."""
