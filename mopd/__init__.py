"""MultiAgent-OPD."""
__version__ = "0.1.0"
