"""Shared pytest configuration for trtfleet's test suite."""
