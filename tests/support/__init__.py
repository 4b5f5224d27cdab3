"""Test servers and helpers shared by the store and artifact suites."""
