"""Generators of random-weight models that the real speech runtimes load (tests and benches)."""
