"""Packaging logic that pyproject.toml cannot express: see build_support.py."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_support import PACKAGE_DATA, package_layout, rewrite_file


class BuildPy(build_py):
    """Copies the packages as usual, then maps their imports under ``convmem`` (not for editable installs)."""

    def build_module(self, module, module_file, package):  # type: ignore[no-untyped-def]
        outfile, copied = super().build_module(module, module_file, package)
        if not getattr(self, "editable_mode", False) and str(outfile).endswith(".py"):
            rewrite_file(outfile)
        return outfile, copied


packages, package_dir = package_layout(os.path.dirname(os.path.abspath(__file__)))
setup(packages=packages, package_dir=package_dir, package_data=PACKAGE_DATA, cmdclass={"build_py": BuildPy})
