"""``model.source`` as an fsspec URL (pipeline.models.remote): a tiny random CTC checkpoint
in a moto S3 bucket on loopback, loaded from its node-cache copy exactly as from the
directory it was saved to; two processes asking for it at once share one download; the
driver's preflight reads its configs, never its weights, and refuses a URL with no
checkpoint in one line; and a local job runs on it end to end.
"""
from __future__ import annotations

import itertools
import json
import multiprocessing
import os
from dataclasses import dataclass

import pytest

# moto's backend is per process and outlives its server: a bucket of its own per test
_BUCKETS = (f"model-url-{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random Wav2Vec2ForCTC saved with safetensors, plus a file it is not loaded from."""
    from test_ctc_family import _wav2vec2

    root = tmp_path_factory.mktemp("w2v")
    model, processor = _wav2vec2(root, "layer")
    model.save_pretrained(root, safe_serialization=True)
    processor.save_pretrained(root)
    (root / "README.md").write_text("a model card: not fetched\n")
    return root


@dataclass
class Bucket:
    endpoint: str
    fs: object      # an s3fs filesystem on the endpoint
    name: str

    @property
    def url(self) -> str:
        return f"s3://{self.name}/w2v"

    @property
    def options(self) -> str:
        return f"storage.options={{endpoint_url: '{self.endpoint}'}}"


@pytest.fixture
def bucket(s3_endpoint, checkpoint):
    """The checkpoint uploaded to ``s3://<bucket>/w2v``."""
    import fsspec
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint)
    name = next(_BUCKETS)
    fs.mkdir(name)
    fs.put(str(checkpoint) + "/", f"{name}/w2v/", recursive=True)
    try:
        yield Bucket(s3_endpoint, fs, name)
    finally:
        # load_config makes a model URL's storage options this process's s3 defaults
        os.environ.pop("FSSPEC_S3", None)
        fsspec.config.conf.pop("s3", None)


def _use_endpoint(bucket: Bucket) -> None:
    """The endpoint as fsspec's s3 default, as a job's storage.options make it."""
    from shardscribe.pipeline.storage import use_options

    use_options({"endpoint_url": bucket.endpoint}, [bucket.url])


def _ctc_config(source: str, cache):
    from shardscribe.pipeline.config import ModelConfig

    return ModelConfig(family="ctc", source=source, device="cpu", cache_dir=str(cache))


def test_a_url_loads_what_its_directory_loads(bucket, checkpoint, tmp_path, sample_audio):
    import torch

    from shardscribe.pipeline.models import load_model

    _use_endpoint(bucket)
    remote = load_model(_ctc_config(bucket.url, tmp_path / "cache"))
    local = load_model(_ctc_config(str(checkpoint), tmp_path / "unused"))
    audio = next(iter(sample_audio.values()))
    a, b = remote.ctc_draft(remote.encode([audio])), local.ctc_draft(local.encode([audio]))
    assert torch.equal(a.log_probs, b.log_probs) and a.texts == b.texts
    (entry,) = [p for p in (tmp_path / "cache" / "models").iterdir() if p.is_dir()]
    assert sorted(p.name for p in entry.iterdir()) == sorted(p.name for p in checkpoint.iterdir()
                                                             if p.name != "README.md")


def test_a_rewritten_checkpoint_is_another_cache_entry(bucket):
    from shardscribe.pipeline.models.remote import entry_name, list_checkpoint

    options, fs, key = {"endpoint_url": bucket.endpoint}, bucket.fs, f"{bucket.name}/w2v/tokenizer_config.json"
    before = entry_name(list_checkpoint(bucket.url, options), weights=True)
    assert entry_name(list_checkpoint(bucket.url, options), weights=True) == before
    fs.pipe(key, fs.cat(key) + b"\n")
    assert entry_name(list_checkpoint(bucket.url, options), weights=True) != before


def test_names_outside_the_folder_are_refused_and_the_rest_is_named(caplog, tmp_path):
    from shardscribe.pipeline.models.errors import ModelError
    from shardscribe.pipeline.models.remote import _sorted_entries, fetch_checkpoint

    for listed in ({"name": "b/w2v/../evil.json", "type": "file"}, {"name": "b/w2v/..", "type": "directory"}):
        with pytest.raises(ModelError, match="not a plain name inside it"):
            _sorted_entries("s3://b/w2v", "b/w2v", [listed])
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "pytorch_model.bin", ".hidden.json"):
        (src / name).write_text("{}")
    with caplog.at_level("INFO", logger="shardscribe.pipeline.models.remote"):
        folder, downloaded = fetch_checkpoint(f"file://{src}", tmp_path / "cache")
    assert downloaded and sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert "not fetched (not files a checkpoint is loaded from): .hidden.json, pytorch_model.bin, sub/" in caplog.text
    (src / "model.safetensors").unlink()
    with pytest.raises(ModelError, match=r"pickled \(pytorch_model.bin\).*safe_serialization=True"):
        fetch_checkpoint(f"file://{src}", tmp_path / "cache")


def _fetch_in_child(url: str, endpoint: str, root: str, barrier, results) -> None:
    from shardscribe.pipeline.models.remote import fetch_checkpoint

    barrier.wait(timeout=60)
    folder, downloaded = fetch_checkpoint(url, root, {"endpoint_url": endpoint})
    results.put((str(folder), downloaded))


def test_two_processes_on_a_node_share_one_download(bucket, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    root = tmp_path / "cache"
    procs = [ctx.Process(target=_fetch_in_child, args=(bucket.url, bucket.endpoint, str(root), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len({folder for folder, _ in got}) == 1
    assert sorted(downloaded for _, downloaded in got) == [False, True]
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == [os.path.basename(got[0][0])]


def test_preflight_reads_the_configs_never_the_weights(bucket, tmp_path):
    from shardscribe.pipeline.config import config_hash, hashed_config, load_config
    from shardscribe.pipeline.models.preflight import check_model

    cfg = load_config("ctc_model_greedy", [bucket.options, f"model.cache_dir={tmp_path}"], model=bucket.url)
    assert (cfg.model.family, cfg.model.source) == ("ctc", bucket.url)
    check_model(cfg.model)
    (entry,) = [p for p in (tmp_path / "models").iterdir() if p.is_dir()]
    assert entry.name.endswith("-configs") and "config.json" in {p.name for p in entry.iterdir()}
    assert not list(entry.glob("*.safetensors"))
    # where the copies go is not what the job writes
    elsewhere = load_config("ctc_model_greedy", [bucket.options], model=bucket.url)
    assert config_hash(cfg) == config_hash(elsewhere)
    assert hashed_config(cfg)["model"]["source@content"] is not None   # the remote folder's content


def test_a_url_without_a_checkpoint_fails_preflight_in_one_line(bucket, tmp_path, capsys, samples_dir):
    from shardscribe.jobs.cli import main

    bucket.fs.pipe(f"{bucket.name}/no-config/model.safetensors", b"")
    base = ["transcribe", "--input", str(samples_dir / "samples.jsonl"), "--output", str(tmp_path / "o"),
            "--runner", "local", "--set", bucket.options, "--set", f"model.cache_dir={tmp_path / 'cache'}"]
    missing, no_config = f"s3://{bucket.name}/missing", f"s3://{bucket.name}/no-config"
    for args, says in ((["--model", missing], f"nothing there (no such checkpoint folder) ({missing})"),
                       (["--config", "ctc_model_greedy", "--set", f"model.source={missing}"],
                        f"model.source={missing}: nothing there"),
                       (["--model", no_config], f"the folder has no config.json (not a transformers checkpoint) "
                                                f"({no_config})")):
        assert main(base + args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "o").exists()


def test_a_url_with_credentials_is_refused():
    from shardscribe.pipeline.config import ConfigError, load_config

    for url in ("s3://AKIA:se/cr+et@bucket/ckpt", "s3://bucket/ckpt?X-Amz-Signature=abc"):
        for kwargs in ({"model": url}, {"overrides": ["model.family=ctc", f"model.source={url}"]}):
            with pytest.raises(ConfigError) as exc:
                load_config("ctc_model_greedy", **kwargs)
            assert "s3://bucket/ckpt:" in str(exc.value) and "se/cr" not in str(exc.value) \
                and "Signature" not in str(exc.value)


def test_a_local_job_transcribes_with_a_model_url(bucket, tmp_path, samples_dir, sample_manifest):
    from conftest import transcribe_in_process

    summary, rows = transcribe_in_process(
        tmp_path / "out", "--input", str(samples_dir / "samples.jsonl"), "--runner", "local",
        "--config", "ctc_model_greedy", "--model", bucket.url, "--set", bucket.options,
        "--set", f"model.cache_dir={tmp_path / 'cache'}")
    assert summary["rows_out"] == len(sample_manifest) == len(rows)
    assert all(r["error"] is None and r["decoder"] == "ctc_greedy" for r in rows.values()), rows
    assert any(r["text"] for r in rows.values())
    assert str(tmp_path / "cache") not in json.dumps(summary) + json.dumps(list(rows.values()), default=str)
    assert [p for p in (tmp_path / "cache" / "models").glob("w2v-*/model.safetensors")]


def test_allow_download_fetches_a_hub_id_where_the_model_loads(monkeypatch, tmp_path):
    """The driver's download fills its own node's Hugging Face cache only: each process
    that loads the model fetches a hub id its node lacks, under model.allow_download alone."""
    import huggingface_hub

    from shardscribe.pipeline.models import model_family
    from shardscribe.pipeline.models.errors import ModelError

    calls = []

    def offline(repo_id, **kwargs):
        calls.append(repo_id)
        raise OSError("no network here")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    ctc, cfg = model_family("ctc"), _ctc_config("nobody-here/ctc-nothing", tmp_path)
    assert ctc.on_this_node(cfg) is cfg and calls == []
    with pytest.raises(ModelError, match="download .model.allow_download. failed"):
        ctc.on_this_node(cfg.with_values(allow_download=True))
    assert calls == ["nobody-here/ctc-nothing"]
    for source in ("embedded", str(tmp_path)):   # the family's shipped model, a directory
        ctc.on_this_node(cfg.with_values(source=source, allow_download=True))
    assert calls == ["nobody-here/ctc-nothing"]
