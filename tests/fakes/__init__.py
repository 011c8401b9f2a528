"""Fakes that implement the product's real interfaces, for fast tests without processes."""
