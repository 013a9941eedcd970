"""Views of a Profile (console tables for now)."""
