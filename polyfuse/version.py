"""The polyfuse version (one place; the compile cache salts its keys with it)."""

__version__ = "0.1.0"
