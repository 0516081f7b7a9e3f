"""The model pool's size and asks from the cluster's resources (actors.pool_size), on
resource tables shaped as ``ray.cluster_resources()`` and ``ray.nodes()`` give them."""
from __future__ import annotations

import pytest

from shardscribe.actors.pool_size import plan_pool
from shardscribe.pipeline.config import load_config
from shardscribe.pipeline.config_values import ConfigError


def _nodes(*shapes):
    return [{"Alive": True, "Resources": {"CPU": float(c), **({"GPU": float(g)} if g else {})}} for c, g in shapes]


def _totals(nodes):
    out = {}
    for n in nodes:
        for k, v in n["Resources"].items():
            out[k] = out.get(k, 0) + v
    return out


def _plan(sets, nodes, local=False, device="auto", uses_device=True, decode_cpus=1.0):
    ray = load_config("ar", ["ray.address=auto", *sets]).ray
    return plan_pool(ray, device, uses_device, _totals(nodes), nodes, local, decode_cpus)


HEAD_AND_TWO_GPU_NODES = _nodes((2, 0), (3, 2), (3, 2))


def test_auto_is_one_model_actor_per_gpu_and_grows_with_the_cluster():
    plan = _plan([], HEAD_AND_TWO_GPU_NODES)
    assert (plan.initial, plan.gpus, plan.grows) == (4, 1.0, True)
    # 3 CPUs for 2 GPUs: 0.5 left per model actor after its own CPU, one audio actor
    assert plan.audio_actors == 1
    joined = HEAD_AND_TWO_GPU_NODES + _nodes((8, 4))
    assert plan.target(_totals(joined), joined, local=False) == 8
    assert _plan(["ray.max_decode_actors=5"], HEAD_AND_TWO_GPU_NODES).target(_totals(joined), joined, False) == 5


def test_auto_leaves_out_gpus_whose_node_has_no_cpu_for_their_actor():
    # 2 CPUs for 2 GPUs: one model actor (1 CPU) and its audio actor (0.5) fit, not two
    lean = _nodes((4, 0), (2, 2), (2, 2))
    plan = _plan([], lean)
    assert (plan.initial, plan.audio_actors) == (2, 1)


def test_without_gpus_auto_is_one_per_node_or_one_locally():
    cpu_cluster = _nodes((4, 0), (16, 0), (16, 0))
    plan = _plan([], cpu_cluster)
    assert (plan.initial, plan.gpus) == (3, 0.0)
    assert _plan([], cpu_cluster, decode_cpus=8.0).initial == 2     # the 4-CPU head fits none
    assert _plan([], _nodes((8, 0)), local=True).initial == 1
    assert _plan([], HEAD_AND_TWO_GPU_NODES, device="cpu").gpus == 0.0
    assert _plan([], HEAD_AND_TWO_GPU_NODES, uses_device=False).gpus == 0.0   # audit: no device


def test_a_number_set_wins_and_is_checked_against_the_cluster():
    assert _plan(["ray.decode_actors=2"], HEAD_AND_TWO_GPU_NODES).initial == 2
    with pytest.raises(ConfigError, match=r"^ray.decode_actors=64: the cluster has 4 GPUs"):
        _plan(["ray.decode_actors=64"], HEAD_AND_TWO_GPU_NODES)
    # an autoscaling cluster adds nodes on demand: the ask waits instead
    assert _plan(["ray.decode_actors=64", "ray.autoscaling=true"], HEAD_AND_TWO_GPU_NODES).initial == 64
    with pytest.raises(ConfigError, match=r"^ray.decode_actor_cpus=4: no node of the cluster fits a model actor"):
        _plan([], HEAD_AND_TWO_GPU_NODES, decode_cpus=4.0)
    with pytest.raises(ConfigError, match=r"^ray.decode_actors=3: 3 model actors need 15 CPUs"):
        _plan(["ray.decode_actors=3", "ray.audio_actors=8"], _nodes((4, 0), (4, 0), (4, 0)), device="cpu")


def test_cuda_on_a_cluster_without_gpus_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^model.device=cuda: the Ray cluster has no GPU"):
        _plan([], _nodes((8, 0)), device="cuda")
