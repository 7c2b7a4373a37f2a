"""pip install --no-build-isolation ./python: the tapeline package for the torch of this Python.

CMake-driven (docs/PYTHON.md, "pip"): configures the repository (the folder above this one) against
this Python's torch (its package folder as CMAKE_PREFIX_PATH) into build-pip/, builds the target
tapeline_python (the extension and its libraries, nothing else), and installs build-pip/python/tapeline.
--no-build-isolation: the build must see the installed torch, whose version the package is then
bound to (it refuses another at import). Needs cmake >= 3.18, a C++17 compiler, ninja or make, and
the Python headers."""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        try:
            import torch
        except ImportError as e:
            raise SystemExit(f"tapeline: building needs torch installed in this Python ({sys.executable}): {e}; "
                             "install torch first, then pip install --no-build-isolation ./python")
        # The torch folder itself, not torch.utils.cmake_prefix_path (its share/cmake): CMake then
        # looks for libc10 and the rest in torch/lib before the system's folders, where another
        # libtorch's (Debian's libtorch-dev) would be found first.
        build = pathlib.Path(os.environ.get("TAPELINE_PIP_BUILD_DIR", ROOT / "build-pip"))
        build.mkdir(parents=True, exist_ok=True)
        args = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                f"-DCMAKE_PREFIX_PATH={os.path.dirname(torch.__file__)}", f"-DTAPELINE_PYTHON={sys.executable}",
                "-DTAPELINE_BUILD_TESTS=OFF", "-DTAPELINE_BUILD_BENCH=OFF", "-DTAPELINE_CUDA=OFF"]
        if shutil.which("ninja") and not (build / "CMakeCache.txt").exists():
            args += ["-G", "Ninja"]
        if shutil.which("ccache") and "CMAKE_CXX_COMPILER_LAUNCHER" not in os.environ:
            args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]  # a rebuild, or objects the repository's build made
        subprocess.run(args, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "--build", str(build), "--target", "tapeline_python", "-j", jobs], check=True)
        built = build / "python" / "tapeline"
        if not any(built.glob("_C*.so")):
            raise SystemExit(f"tapeline: the build made no extension in {built}: see the CMake output above "
                             "('the Python package is not built: ...' says why)")
        out = pathlib.Path(self.get_ext_fullpath(ext.name)).parent
        out.mkdir(parents=True, exist_ok=True)
        for f in built.iterdir():
            if f.suffix in (".so", ".py"):
                shutil.copy2(f, out / f.name)


setup(
    name="tapeline",
    version="0.1.0",
    description="tapeline's codecs (compressed model-parallel messages) for PyTorch",
    packages=["tapeline"],
    ext_modules=[Extension("tapeline._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
)
