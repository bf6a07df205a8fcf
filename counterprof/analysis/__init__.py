"""Pure functions over a run's tables: they never read files and never print."""
