from setuptools import find_packages, setup

setup(
    name="lpsim",
    version="0.1.0",
    description="Low-precision arithmetic simulator fp(e, m, b) with a numba.cuda GPU backend",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["lpsim", "lpsim.*", "lpsim_cuda", "lpsim_cuda.*"]),
    python_requires=">=3.10",
    install_requires=["numpy>=1.24", "numba>=0.60", "numba-cuda>=0.20", "rich>=13", "tqdm>=4.60"],
    extras_require={
        # torch is pinned: 2.13.0 is the CPU build these machines carry; an unpinned torch
        # pulls gigabytes of CUDA packages.
        "torch": ["torch==2.13.0"],
        "test": ["pytest>=7", "hypothesis>=6.80", "ml_dtypes>=0.5", "torch==2.13.0",
                 "scikit-learn>=1.3", "scipy>=1.10", "matplotlib>=3.7"],
        "peers": ["torch==2.13.0", "qtorch==0.3.0", "ninja", "ml_dtypes>=0.5", "torchao==0.18.0"],
    },
    entry_points={"console_scripts": ["lpsim=lpsim.cli:main"]},
)
