"""Polyhedral layer: isl model of a micrograph, scheduling under a budget, tiling and mapping."""
