"""pip install of the pure-Python core (no ROS needed).

The ROS 2 package itself is built by ament_cmake (CMakeLists.txt); this file
lets users without ROS use the scheduler, simulator and engines:
``pip install .`` ships skills/, config/ and data/ inside the package.
"""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
DATA_DIRS = ("skills", "config", "data")


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        share = Path(self.build_lib) / "timelyllm_ros" / "share"
        for name in DATA_DIRS:
            src = HERE / name
            if src.is_dir():
                shutil.copytree(src, share / name, dirs_exist_ok=True)


setup(
    name="timelyllm_ros",
    version="0.1.0",
    description="Time-sensitive segmented LLM task planning for robot fleets",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["timelyllm_ros", "timelyllm_ros.*"]),
    install_requires=["pyyaml>=6", "numpy>=1.24", "matplotlib>=3.7", "tqdm>=4.60", "rich>=13"],
    extras_require={
        "vllm": ["vllm>=0.11"],
        "transformers": ["transformers>=4.50", "torch>=2.4"],
        "tello": ["djitellopy==2.5.0"],
        "bags": ["rosbags>=0.10", "mcap>=1.2", "mcap-ros2-support>=0.5"],
    },
    entry_points={
        "console_scripts": [
            "timelyllm=timelyllm_ros.cli:main",
        ],
    },
    cmdclass={"build_py": BuildWithData},
)
