"""Typed run configuration: sections, validation, loading."""
