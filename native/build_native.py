"""cffi build script (API mode) for counterprof._native.

setup.py names it in cffi_modules; `pip install .` compiles native/counterprof_native.c.
"""
import pathlib
import re

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
HEADER = HERE / "counterprof_native.h"
KERNEL_SAMPLER_HEADER = HERE / "kernel_sampler.h"


def _cdef_from_header(text: str) -> str:
    """The header minus preprocessor lines and comments: cffi's cdef takes plain declarations."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return "\n".join(lines)


ffibuilder = FFI()
ffibuilder.cdef(_cdef_from_header(HEADER.read_text()))
ffibuilder.cdef(_cdef_from_header(KERNEL_SAMPLER_HEADER.read_text()))
ffibuilder.set_source(
    "counterprof._native",
    '#include "counterprof_native.h"\n#include "kernel_sampler.h"',
    sources=[str((HERE / name).relative_to(HERE.parent))
             for name in ("counterprof_native.c", "procstat.c", "kineto.c", "kernel_sampler.c", "spill.c")],
    include_dirs=[str(HERE.relative_to(HERE.parent))],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=gnu11"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
