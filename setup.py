"""Package discovery for the source roots (hg_dagger/, ui/, devices/) and the shipped configs/; metadata lives in
pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = {"hg_dagger": "hg_dagger", "hg_dagger.ui": "ui", "hg_dagger.devices": "devices", "hg_dagger.configs": "configs"}


def _packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(where=folder)]
    return sorted(set(found))


setup(packages=_packages(), package_dir=ROOTS)
