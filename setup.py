"""What the wheel holds; the metadata lives in setup.cfg.

The top-level ``recipes/`` and ``envs/`` folders ship inside the package, one copy each:
``recipes/`` as ``agentrl_ext.recipes`` (Hydra finds it as ``pkg://agentrl_ext.recipes``) and
``envs/<task>/`` as ``agentrl_ext.envs.<task>`` (a task worker is
``agentrl_ext.envs.letters.task:LettersTask``). An installed ``agentrl-train`` thus runs from any
directory, and site-packages gets no top-level ``envs`` package. The two server scripts the
launcher runs (``scripts/mariadb.sh``, ``scripts/dockerd.sh``) ship as ``agentrl_ext/scripts/``, so
that ``agentrl-envs up`` starts MariaDB and the private Docker engine from a wheel install too.
"""

from setuptools import find_packages, setup

SHIPPED_FOLDERS = {
    "agentrl_ext.recipes": "recipes",
    "agentrl_ext.envs": "envs",
    "agentrl_ext.scripts": "scripts",
}
#: the scripts of scripts/ that the launcher runs (the others are for a source checkout)
SHIPPED_SCRIPTS = ["mariadb.sh", "dockerd.sh"]

packages = find_packages(include=["agentrl_ext", "agentrl_ext.*"])
for package, folder in SHIPPED_FOLDERS.items():
    packages += [package] + [f"{package}.{sub}" for sub in find_packages(folder)]

setup(
    packages=packages,
    package_dir=SHIPPED_FOLDERS,
    package_data={
        "agentrl_ext.recipes": ["**/*.yaml"],
        "agentrl_ext.scripts": SHIPPED_SCRIPTS,
        # a task folder's README and Dockerfile travel with its worker code
        **{p: ["README.md", "Dockerfile"] for p in packages if p.startswith("agentrl_ext.envs.")},
    },
)
