"""lakeFS's wrapper tests, run from a checkout against the lakeFS test server (README.md)."""
