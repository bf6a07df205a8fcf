"""The ground floor: the vocabulary every other layer of counterprof stands on, importing
nothing of counterprof above it (the layer contract in pyproject.toml, checked in CI).

  record      the frozen-record decorator every typed row and result uses
  schema      the run's Parquet table schemas (samples, spans, ...) and their categories
  errors      the errors a user sees, each saying what to do
  clock       the run's clock (CLOCK_MONOTONIC plus one offset)
  units       how numbers become words (perf stat's)
  kernels     GPU kernel classes (HTA's, with our differences)
  opcost      FLOPs and bytes of an op from its shapes
  thresholds  every threshold the verdict uses, with where it comes from
  threadname, proctree, pathsearch, redact, gil, gitrev: small shared helpers of the OS and repo
"""
