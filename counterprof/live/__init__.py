"""The live view (`counterprof run --live`, `counterprof top`, `--serve`), bottom up:

  buckets    per-tick sums of a series and the values read from them (rates, ratios, gauges)
  window     LiveWindow, the session sink that keeps the last minute of samples as buckets
  traces     the torch and jax trace windows' MFU, as they arrive at the window
  figures    what a frame shows, as numbers: Figure, PanelFigures, LiveVerdict, LiveFigures
  panels     the perf, host and threads panels;  devices: one panel per GPU or device
  mfu        the trace windows' MFU panel (torch trace, jax trace);  verdict: the bottleneck line
  frame      live_figures(): every panel and the verdict of one frame
  processes  counterprof top's process table (psutil, polled on a thread)
  render     the dashboard, its compact forms and the plain line (rich), in the words of
             ground/units.py (the one place numbers become words)
  terminal   the bottom region of the terminal and keys in cbreak mode
  view       LiveView, the thread that draws the window 4 times a second

Imports nothing here: a command loads only the parts it uses.
"""
