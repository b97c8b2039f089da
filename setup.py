"""The one part of the build pyproject.toml cannot say: jobd's C extensions,
``jobd.process._clonexec`` (a handler start the daemon does not wait for; see its source) and
``jobd.daemon._receive`` (the handlers' channel read a batch at a time without the GIL).
Optional: where they cannot be built (another system, no C compiler), jobd starts handlers with
vfork as before (``jobd.process.spawn``) and reads the channel in Python
(``jobd.daemon.receive``)."""

import platform
import sys

from setuptools import Extension, setup

NATIVE = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")

setup(
    ext_modules=[
        Extension("jobd.process._clonexec", ["jobd/process/_clonexec.c"], optional=True),
        Extension("jobd.daemon._receive", ["jobd/daemon/_receive.c"], optional=True),
    ]
    if NATIVE
    else []
)
