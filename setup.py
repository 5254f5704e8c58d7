"""Build of the ``exogym._C`` extension only; metadata lives in ``pyproject.toml``.

The CPU kernels (``csrc/*.cpp``, ``csrc/cpu/*.cpp``) are built everywhere. The CUDA kernels
(``csrc/cuda/*.cu``) are added only where torch was built with CUDA and nvcc is found.
``EXOGYM_NO_EXTENSION=1`` skips the extension entirely (the pure-torch references are used).

torch must already be installed: build with ``pip install --no-build-isolation -e .`` so that
pip does not fetch a second (possibly multi-GB CUDA) torch into an isolated build environment.
"""

import glob
import os

from setuptools import setup

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError as e:  # pragma: no cover - build-time guidance
    raise SystemExit(
        "exogym's extension build needs torch installed first, e.g. "
        "`pip install torch==2.13.0 && pip install --no-build-isolation -e .`"
    ) from e


def _extensions() -> list:
    if os.environ.get("EXOGYM_NO_EXTENSION", "0") == "1":
        return []
    here = os.path.dirname(os.path.abspath(__file__))
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    sources += sorted(glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    cxx = ["-O3", "-fopenmp", "-DPy_LIMITED_API=0x030A0000"]
    link = ["-fopenmp"]
    use_cuda = torch.version.cuda is not None and CUDA_HOME is not None and os.environ.get("EXOGYM_NO_CUDA", "0") != "1"
    if use_cuda:
        sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
        return [
            CUDAExtension(
                "exogym._C",
                sources,
                include_dirs=[os.path.join(here, "csrc")],
                extra_compile_args={"cxx": cxx + ["-DEXOGYM_WITH_CUDA"], "nvcc": ["-O3"]},
                extra_link_args=link,
                py_limited_api=True,
            )
        ]
    return [
        CppExtension(
            "exogym._C",
            sources,
            include_dirs=[os.path.join(here, "csrc")],
            extra_compile_args={"cxx": cxx},
            extra_link_args=link,
            py_limited_api=True,
        )
    ]


class _IncrementalBuildExtension(BuildExtension):
    """torch's ``BuildExtension`` with a build folder that survives the build: an editable
    install (``pip install -e .``) otherwise compiles in a fresh temporary folder each time,
    so re-running the install rebuilt every kernel. With ``build/editable`` kept, ninja
    recompiles only what changed (nothing, when nothing did) and relinks."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if getattr(self, "editable_mode", False) or self.inplace:
            self.build_temp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build", "editable")


setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": _IncrementalBuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
