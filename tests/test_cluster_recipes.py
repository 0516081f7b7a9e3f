"""The cluster recipes, checked without a cluster: the KubeRay RayJob names the image the
Dockerfile's documented build tags (the project's version, Ray at the manifest's
rayVersion, the README's install path), and the Slurm script waits for its nodes with a
`ray status` poll under a deadline, never a bare `sleep N`: its poll runs here against a
stand-in `ray` that prints what `ray status` prints."""
from __future__ import annotations

import os
import re
import subprocess
import tomllib

import yaml

from conftest import ROOT

CLUSTER = ROOT / "docs" / "cluster"
DOCKERFILE = ROOT / "Dockerfile"


def _images(node) -> list[str]:
    """Every container ``image`` anywhere in a parsed manifest."""
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "image" and isinstance(v, str)] + \
            [i for v in node.values() for i in _images(v)]
    if isinstance(node, list):
        return [i for v in node for i in _images(v)]
    return []


def _documented_tags() -> list[str]:
    """The tags of the `docker build` commands the Dockerfile's comments give."""
    text = DOCKERFILE.read_text()
    # A command may continue over comment lines ending in a backslash.
    joined = re.sub(r"\\\n#\s*", " ", text)
    return re.findall(r"^#\s+docker build .*?-t (\S+) \.$", joined, re.M)


def test_the_rayjob_names_the_image_the_dockerfile_builds():
    job = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    images = set(_images(job["spec"]["rayClusterSpec"]))
    tags = _documented_tags()
    assert len(tags) >= 2, tags                                  # the CPU build and its GPU variant
    default = tags[0]
    assert images == {default}, (images, tags)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert default.rsplit(":", 1)[1] == version and default.startswith("REGISTRY/shardscribe:")
    assert f"docker build -t {default} ." in (CLUSTER / "rayjob.yaml").read_text()
    dockerfile = DOCKERFILE.read_text()
    # Ray in the image is the cluster's Ray; the image installs as the README does.
    ray_version = job["spec"]["rayClusterSpec"]["rayVersion"]
    assert re.search(rf"^ARG RAY_VERSION={re.escape(ray_version)}$", dockerfile, re.M), ray_version
    assert "bash scripts/setup.sh" in dockerfile and (ROOT / "scripts" / "setup.sh").exists()
    assert re.search(r"^ARG TORCH_INDEX=https://download\.pytorch\.org/whl/cpu$", dockerfile, re.M)
    # Every file the Dockerfile copies by name is in the repository.
    for line in re.findall(r"^COPY (.+)$", dockerfile, re.M):
        for src in line.split()[:-1]:
            assert (ROOT / src).exists(), src


def _loop_depth_of_sleeps(script: str) -> list[tuple[int, int]]:
    """(line number, loop depth) of each `sleep` command in a shell script."""
    depth, found = 0, []
    for number, raw in enumerate(script.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if re.match(r"^(while|until|for)\b", line):
            depth += 1
        if re.search(r"(^|[;&|]\s*)sleep\b", line):
            found.append((number, depth))
        if re.search(r"(^|;\s*)done\b", line):
            depth -= 1
    return found


def test_the_slurm_script_polls_ray_status_instead_of_sleeping():
    script = (CLUSTER / "slurm.sh").read_text()
    sleeps = _loop_depth_of_sleeps(script)
    assert sleeps and all(depth > 0 for _, depth in sleeps), sleeps       # no bare `sleep N`
    assert "ray status" in script and re.search(r"RAY_WAIT_S", script)
    assert subprocess.run(["bash", "-n", str(CLUSTER / "slurm.sh")]).returncode == 0


def _poll(tmp_path, up_after: list[int], want: int, wait_s: int) -> subprocess.CompletedProcess:
    """The script's own poll functions, with a stand-in `ray` whose `ray status` shows
    ``up_after[i]`` nodes on its i-th call (the last count from then on; -1: the head does
    not answer), printed as `ray status` prints them."""
    script = (CLUSTER / "slurm.sh").read_text()
    functions = re.search(r"^nodes_up\(\) \{.*?^\}\n.*?^wait_for_nodes\(\) \{.*?^\}\n", script, re.M | re.S)
    assert functions, "slurm.sh defines nodes_up and wait_for_nodes"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    counts = " ".join(map(str, up_after))
    (bin_dir / "ray").write_text(f"""#!/usr/bin/env bash
calls=$(cat "{tmp_path}/calls" 2>/dev/null || echo 0); echo $((calls + 1)) > "{tmp_path}/calls"
counts=({counts}); last=$(( ${{#counts[@]}} - 1 )); i=$(( calls < last ? calls : last )); n=${{counts[$i]}}
if [ "$n" -lt 0 ]; then echo "ConnectionError: the head does not answer" >&2; exit 1; fi
echo "======== Autoscaler status: 2026-01-01 00:00:00 ========"
echo "Node status"; echo "Active:"
for k in $(seq 1 "$n"); do echo " 1 node_$k"; done
echo "Pending:"; echo " (no pending nodes)"
""")
    (bin_dir / "ray").chmod(0o755)
    (tmp_path / "calls").unlink(missing_ok=True)
    driver = ("set -euo pipefail\nhead_ip=10.0.0.1; port=6379; RAY_WAIT_S=" + str(wait_s) + "\n"
              + functions.group(0).replace("sleep 5", "sleep 0.05") + f"wait_for_nodes {want}\necho ready\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", driver], env=env, capture_output=True, text=True, timeout=60)


def test_the_slurm_poll_waits_for_every_node_and_gives_up_at_its_deadline(tmp_path):
    # The head refuses at first, then the nodes join one by one.
    done = _poll(tmp_path, [-1, 0, 1, 2, 3], want=3, wait_s=30)
    assert done.returncode == 0 and done.stdout.strip() == "ready", done.stderr
    assert int((tmp_path / "calls").read_text()) >= 5
    # Two of three nodes, for good: it stops with one line naming the count, not "ready".
    stuck = _poll(tmp_path, [2], want=3, wait_s=1)
    assert stuck.returncode == 1 and "ready" not in stuck.stdout, stuck
    assert "2 of 3 Ray nodes up after 1 s" in stuck.stderr, stuck.stderr
