"""Package discovery for memrl: every ``memrl.*`` subpackage, plus ``adapters/`` and ``prompts/`` installed as
``memrl_adapters`` / ``memrl_prompts`` (``adapters`` is AdapterHub's import name on PyPI). Metadata is in
pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["memrl", "memrl.*"]) + ["memrl_adapters", "memrl_prompts"],
    package_dir={"memrl_adapters": "adapters", "memrl_prompts": "prompts"},
)
