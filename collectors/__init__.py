"""counterprof's built-in collectors, installed as the package counterprof.collectors.

They register through the `counterprof.collectors` entry-point group, like any
third-party collector; the core never imports them by name.
"""
if __name__ != "counterprof.collectors":
    raise ImportError(
        "the 'collectors' directory is counterprof's built-in collectors and is only "
        "importable as counterprof.collectors; install the package with `pip install .` "
        "and import counterprof.collectors")
