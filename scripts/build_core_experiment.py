import os, sys, shutil, tempfile, warnings
from mypyc.build import mypycify
from setuptools import setup
mods = sys.argv[1:]
tmp = tempfile.mkdtemp(prefix="mypyc-core-")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    setup(name="core-native", ext_modules=mypycify(mods, opt_level="3", group_name="core_native"),
          script_args=["-q", "build_ext", "--inplace", "--build-temp", tmp, "--build-lib", tmp])
