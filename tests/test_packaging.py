"""The project installs as one import package, ``shardscribe``, whose folder is the
repository's root: the source folders pipeline/, actors/ and jobs/ become
shardscribe.pipeline, .actors and .jobs, conf/ becomes shardscribe/conf, and nothing else
lands at the top of site-packages (names such as ``pipeline`` would collide with whatever
else a user installs)."""
from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile

import pytest

from conftest import ROOT

LAYERS = ("pipeline", "actors", "jobs")


def test_every_source_package_is_listed():
    """pyproject.toml lists the packages by hand (a package-dir mapping cannot be found by
    setuptools' scan): the list is every folder of the layers with an __init__.py."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {".".join(("shardscribe", *p.parent.relative_to(ROOT).parts))
            for layer in LAYERS for p in (ROOT / layer).rglob("__init__.py")}
    assert listed == tree | {"shardscribe"}


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("shardscribe-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    assert {n.split("/")[0] for n in names} == {"shardscribe", wheel.name.split("-py3")[0] + ".dist-info"}
    # the package's own files: its __init__, the layers, the configs; not the tests, docs or scripts
    assert {n.split("/")[1] for n in names if n.startswith("shardscribe/")} == \
        {"__init__.py", "pipeline", "actors", "jobs", "conf"}
    assert "shardscribe/conf/default.yaml" in names
    assert "shardscribe/pipeline/decoding/ctc_beam/loop_native.c" in names
    assert any(n.startswith("shardscribe/pipeline/assets/samples/") for n in names)
    # Only the extracted wheel and the standard library on the path (-S: no site-packages,
    # so not this checkout's editable install): the package and its layers import, the
    # configs sit where the config loader looks, and there is no top-level `pipeline`.
    probe = (
        "import sys, pathlib; sys.path.insert(0, sys.argv[1]);"
        "import shardscribe, shardscribe.pipeline, shardscribe.actors, shardscribe.jobs;"
        "assert pathlib.Path(shardscribe.pipeline.__file__).parent.parent.joinpath('conf', 'ssd.yaml').is_file();"
        "import importlib.util as u; assert u.find_spec('pipeline') is None and u.find_spec('jobs') is None;"
        "print(shardscribe.pipeline.__file__)")
    out = subprocess.run([sys.executable, "-S", "-I", "-c", probe, str(tmp_path / "site")], cwd=tmp_path,
                         check=True, capture_output=True, text=True).stdout
    assert out.startswith(str(tmp_path / "site"))
