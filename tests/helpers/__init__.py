"""Helpers shared by the test folders: record builders, fakes, prompt readers, run settings."""
