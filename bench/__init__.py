"""Benchmarks: scripts that print numbers and write reports to bench/results/ (not tests)."""
