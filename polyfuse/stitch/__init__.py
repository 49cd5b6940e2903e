"""Stitching layer: turns scheduled micrographs into kernel plans (Layer 2/3 stitching)."""
