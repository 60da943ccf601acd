"""Benchmarks: measurements run in fresh processes, and the tables and plots made from them."""
