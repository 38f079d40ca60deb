"""Everything else is in pyproject.toml. Packages are found, never listed by hand: every
package under the project's top-level names, plus models/ installed as `zoo.presets`."""

from setuptools import find_packages, setup

TOP_LEVEL = ["zoo", "peers", "runtime", "export", "parity", "analysis", "bench", "serve", "cli"]

setup(packages=[*find_packages(include=[f"{n}*" for n in TOP_LEVEL]), "zoo.presets"])
