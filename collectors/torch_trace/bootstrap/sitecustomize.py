"""counterprof's bootstrap, on PYTHONPATH of processes launched by `counterprof run --torch`
(or --jax).

Python imports `sitecustomize` at start-up (unless run with -S or -I). This one arms a hook
that starts torch.profiler in the process once it imports torch (processes that never import
torch are left alone), under --jax the same for jax (collectors/jax_trace/bootstrap), then
runs the sitecustomize it shadows, if there is one, so an existing site customisation keeps
working.
"""


def _counterprof_bootstrap() -> None:
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        if here not in sys.path:
            sys.path.append(here)
        import _counterprof_torch_driver
        _counterprof_torch_driver.install_from_env()
    except Exception as exc:   # never stop the workload from starting
        print(f"counterprof: torch bootstrap failed in pid {os.getpid()}: {exc}", file=sys.stderr)
    if "COUNTERPROF_JAX" in os.environ:      # `counterprof run --jax`: the jax driver, beside torch's
        try:
            import importlib.util
            name = "_counterprof_jax_driver"
            path = os.path.join(os.path.dirname(os.path.dirname(here)), "jax_trace", "bootstrap",
                                name + ".py")
            spec = importlib.util.spec_from_file_location(name, path)   # not on sys.path
            assert spec is not None and spec.loader is not None     # a .py file's
            jax_driver = importlib.util.module_from_spec(spec)
            sys.modules[name] = jax_driver
            spec.loader.exec_module(jax_driver)
            jax_driver.install_from_env()
        except Exception as exc:   # never stop the workload from starting
            print(f"counterprof: jax bootstrap failed in pid {os.getpid()}: {exc}", file=sys.stderr)

    # chain to the sitecustomize this one shadows
    import importlib.machinery
    import importlib.util
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_counterprof_bootstrap()
del _counterprof_bootstrap
