"""Functions over a run's tables: they read a run only through its front door
(store.reader.Run: tables, batches, meta), never its files, and never print."""
