"""The run directory: journal writer, compaction to Parquet, reader."""
