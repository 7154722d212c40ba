"""Benchmarks: simulated policy comparisons (paper Figs. 5, 7, 8, 9) and scheduler overhead."""
