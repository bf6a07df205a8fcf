# Only what pyproject.toml cannot say: the cffi extension built from native/.
from setuptools import setup

setup(cffi_modules=["native/build_native.py:ffibuilder"])
