"""Test doubles shared by the unit tests: one place for each fake (see each module)."""
