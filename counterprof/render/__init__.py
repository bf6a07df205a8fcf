"""Renderers: they format analysis results and compute nothing."""
