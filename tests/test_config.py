"""Config validation: every error names its key, and fails before Ray starts."""
from __future__ import annotations

import pytest

from shardscribe.pipeline.config import ConfigError, load_config


def test_default_is_ssd_high_accuracy_and_ar_stays_available():
    cfg = load_config()
    assert cfg.decoder.kind == "ssd" and cfg.ssd.preset == "high_accuracy"
    assert cfg.model.ctc_head == "embedded"
    assert load_config("ar").decoder.kind == "ar"


@pytest.mark.parametrize("override, key", [
    (["model.dtyp=float16"], "model.dtyp"),
    (["nosuch.section=1"], "nosuch"),
    (["decoder.kind=beam_of_light"], "decoder.kind"),
    (["batching.max_tokens=lots"], "batching.max_tokens"),
    (["batching.max_tokens=10"], "batching.max_tokens"),
    (["audio.max_segment_s=45"], "audio.max_segment_s"),
    (["model.device=tpu"], "model.device"),
    (["ray.decode_actors=0"], "ray.decode_actors"),
    (["audio.vad_threshold=.nan"], "audio.vad_threshold"),
    (["audio.read_timeout_s=.inf"], "audio.read_timeout_s"),     # failed only after workers started
    (["storage.options.password=@SeCrEt"], "--set storage.options.password"),
    (["decoder=3"], "decoder"),
    (["justakey"], "--set 'justakey'"),
    (["transducer.expansion_gamma=2.3"], "transducer.expansion_gamma"),   # ALSD++ has no expansion beam
    (["transducer.algorithm=aes", "transducer.expansion_gamma=-1"], "transducer.expansion_gamma"),
    (["output.commit_interval_s=-5"], "output.commit_interval_s"),
    (["output.commit_interval_s=.inf"], "output.commit_interval_s"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config("ar", override)
    assert str(err.value).startswith(key), str(err.value)


def test_overrides_are_typed():
    cfg = load_config("ar", ["batching.max_tokens=12000", "audio.max_segment_s=20", "model.cache_dir=null"])
    assert cfg.batching.max_tokens == 12000
    assert cfg.audio.max_segment_s == 20.0 and isinstance(cfg.audio.max_segment_s, float)
    assert cfg.model.cache_dir is None


def test_a_value_that_is_not_yaml_is_not_echoed():
    with pytest.raises(ConfigError) as err:
        load_config("ar", ["storage.options.password=@SeCrEt"])
    assert "SeCrEt" not in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text, says", [
    ("model: [unclosed\n", r"not valid YAML \(line 2\)"),
    ("extends: [ar, ssd]\n", "extends: expected one config name"),
    ("extends: 5\n", "extends: expected one config name"),
])
def test_bad_config_files_are_one_line(tmp_path, text, says):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says) as err:
        load_config(str(path))
    assert "\n" not in str(err.value)
    path.write_bytes(b"batching:\n  max_tokens: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(path))


def test_a_shipped_parent_is_found_whatever_the_working_directory_holds(tmp_path, monkeypatch):
    """conf/ssd.yaml extends "ar": a folder or file named ar where the job runs is not it;
    a user's config finds its parent beside itself."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ar").mkdir()
    assert load_config("ssd").decoder.kind == "ssd"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "base.yaml").write_text("batching:\n  max_tokens: 3000\n")
    (tmp_path / "mine" / "child.yaml").write_text("extends: base\n")
    assert load_config(str(tmp_path / "mine" / "child.yaml")).batching.max_tokens == 3000


def test_unknown_config_file():
    with pytest.raises(ConfigError, match="no such file"):
        load_config("does-not-exist")


def test_extends_merges_sections(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("extends: ar\nbatching:\n  max_tokens: 3000\n")
    cfg = load_config(str(child))
    assert cfg.batching.max_tokens == 3000
    assert cfg.batching.recordings_per_batch == load_config("ar").batching.recordings_per_batch


def test_bad_config_fails_before_ray_starts(tmp_path, samples_dir):
    import ray

    from shardscribe.jobs.cli import main

    was_running = ray.is_initialized()
    code = main(["transcribe", "--input", str(samples_dir), "--output", str(tmp_path / "o"),
                 "--set", "batching.max_tokenz=1"])
    assert code == 2
    assert ray.is_initialized() == was_running
    assert not (tmp_path / "o").exists()


def test_a_preset_named_in_a_yaml_is_taken_whole(tmp_path):
    """A config file's own high_rtfx that leaves out pack_gate and gate_verify_tau must not
    inherit them from the shipped preset of the same name; an override still reaches in."""
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nmodel: {ctc_head: embedded}\ndecoder: {kind: ssd}\n"
                    "ssd: {preset: high_rtfx, presets: {high_rtfx: {tau_ctc: 1.5, tau_slm: 0.1}}}\n")
    cfg = load_config(str(path))
    assert cfg.ssd.thresholds() == (1.5, 0.1)
    assert cfg.ssd.packs_gate() is False and cfg.ssd.gate_verify_threshold() is None
    assert "high_accuracy" in cfg.ssd.presets
    shipped = load_config("ssd", ["ssd.preset=high_rtfx", "ssd.presets.high_rtfx.gate_verify_tau=null",
                                  "ssd.presets.high_rtfx.pack_gate=true"])
    assert shipped.ssd.packs_gate() is True and shipped.ssd.gate_verify_threshold() is None



def test_config_hash_names_what_decides_the_transcripts():
    from shardscribe.pipeline.config import config_from_dict, config_hash

    base = config_hash(load_config("ar"))
    assert len(base) == 12
    same = ["ray.num_cpus=3", "batching.max_tokens=30000", "model.cache_dir=/x", "model.device=cpu",
            "model.num_threads=2", "model.screened_argmax=false", "output.rows_per_part=5",
            "output.commit_interval_s=30",
            "audio.read_timeout_s=900", "storage.options={endpoint_url: 'http://127.0.0.1:9000'}"]
    assert config_hash(load_config("ar", same)) == base
    # A worker rebuilds the config from its dict and must stamp the driver's hash.
    assert config_hash(config_from_dict(load_config("ar").to_dict())) == base
    for other in (["decoder.max_new_tokens=100"], ["model.source=/some/whisper"], ["audio.vad_threshold=0.4"]):
        assert config_hash(load_config("ar", other)) != base, other
    assert config_hash(load_config("ssd")) != base


def test_auto_encoder_dtype_hashes_as_what_it_means_on_this_machine(monkeypatch):
    from shardscribe.pipeline import device
    from shardscribe.pipeline.config import config_hash

    for native, meaning in ((True, "bfloat16"), (False, "null")):
        monkeypatch.setattr(device, "cpu_bf16_native", lambda native=native: native)
        auto = config_hash(load_config("ar", ["model.device=cpu"]))
        assert auto == config_hash(load_config("ar", ["model.device=cpu", f"model.encoder_dtype={meaning}"]))
    assert auto != config_hash(load_config("ar", ["model.device=cpu", "model.encoder_dtype=bfloat16"]))


def test_a_local_instance_too_small_for_the_actor_pools_is_refused():
    """A model actor of 1 CPU and its audio actor's 0.5 do not fit 2 logical CPUs with
    the one Ray's own tasks need: Ray would start what fits and wait for the rest for ever
    (`ar` with ray.num_cpus=2 waited at 0 of 7 recordings)."""
    with pytest.raises(ConfigError, match=r"ray.num_cpus: the actor pools need 1.5 CPUs "
                                          r"\(ray.\*_actors x ray.\*_actor_cpus\) and Ray's tasks 1 more, got 2"):
        load_config("ctc_beam", ["ray.num_cpus=2", "ray.decode_actor_cpus=1"])
    with pytest.raises(ConfigError, match=r"actor pools need 1.5 CPUs .* got 2"):
        load_config("ar", ["ray.num_cpus=2"])
    assert load_config("ar", ["ray.num_cpus=3"]).ray.num_cpus == 3          # one model pool and the tasks fit
    assert load_config("ctc_beam", ["ray.num_cpus=2", "ray.address=ray://head:10001"]).ray.num_cpus == 2


def test_a_model_actor_gets_the_cores_a_local_instance_has_left():
    """A model actor's CPUs are its threads (Ray sets OMP_NUM_THREADS): on a local instance
    it gets the physical cores by default, shared among the model actors and within an
    explicit ray.num_cpus, and the instance is sized to hold every actor and Ray's tasks.
    A two-stage kind's second stage runs in its model actor: no pool of its own."""
    ray = load_config("ar").ray
    assert ray.decode_actors == "auto" and ray.local_decode_actors == 1
    assert ray.cpus(cores=8).decode_actor == 8.0
    assert ray.cpus(cores=1).decode_actor == 1.0
    two = load_config("ar", ["ray.decode_actors=2"]).ray.cpus(cores=8)
    assert two.decode_actor == 4.0 and two.local >= 2 * 0.5 + 2 * 4 + 1
    ssd = load_config(None).ray.cpus(cores=16)
    assert ssd.decode_actor == 16.0 and ssd.local >= 0.5 + 16 + 1
    # within ray.num_cpus=4: 4 - 0.5 (audio) - 1 (tasks) leaves 2
    within = load_config(None, ["ray.num_cpus=4"]).ray.cpus(cores=16)
    assert (within.local, within.decode_actor, within.pools) == (4, 2.0, 2.5)
    assert load_config("ar", ["ray.decode_actor_cpus=3"]).ray.cpus(cores=16).decode_actor == 3.0
    cluster = load_config("ar", ["ray.address=ray://head:10001"]).ray.cpus(cores=16)
    assert (cluster.local, cluster.decode_actor) == (None, 1.0)


def test_a_model_actor_fits_the_local_instance_already_running():
    """A local instance started for another config (4 logical CPUs) holds the model actor,
    its audio actor and Ray's tasks with 2 CPUs for the model actor."""
    assert load_config(None).ray.cpus(cores=16, instance_cpus=4).decode_actor == 2.0
    assert load_config("ar", ["ray.decode_actors=2"]).ray.cpus(cores=16, instance_cpus=4).decode_actor == 1.0


def test_decode_actors_take_auto_or_a_number():
    assert load_config("ar", ["ray.decode_actors=3"]).ray.decode_actors == 3
    assert load_config("ar", ["ray.audio_actors=auto"]).ray.audio_actors == "auto"
    for bad, key in [("ray.decode_actors=many", "ray.decode_actors"), ("ray.audio_actors=0", "ray.audio_actors"),
                     ("ray.max_decode_actors=0", "ray.max_decode_actors"), ("ray.rows_per_unit=0", "ray.rows_per_unit")]:
        with pytest.raises(ConfigError, match=key):
            load_config("ar", [bad])


@pytest.mark.parametrize("command, extra", [
    ("calibrate", ["--output", "cal.json"]),
    ("validate", []),
])
def test_calibrate_and_validate_refuse_in_one_line(command, extra, tmp_path, samples_dir, capsys):
    """A bad config, a missing input or a missing model: exit 2 and one line, as transcribe
    (calibrate raised a traceback; validate went on to report an audit of nothing)."""
    import argparse
    import importlib

    module = importlib.import_module(f"shardscribe.jobs.{command}")
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    good = str(samples_dir / "samples.jsonl")
    cases = [["--set", "batching.max_tokens=abc"], ["--set", f"model.source={tmp_path / 'nope'}"]]
    if command == "calibrate":
        cases.append(["--input", str(tmp_path / "missing.jsonl")])
    for case in cases:
        args = ["--input", good] if command == "calibrate" else [good]
        args = args + [a if a != "cal.json" else str(tmp_path / a) for a in extra] + case
        if command == "calibrate" and case[0] == "--input":
            args = args[2:]
        capsys.readouterr()
        assert module.run(parser.parse_args(args)) == 2, case
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("shardscribe: error:"), err


def test_an_output_under_a_file_is_named_as_the_output(tmp_path, samples_dir, capsys):
    import argparse

    from shardscribe.jobs.transcribe import add_arguments, run

    (tmp_path / "afile").write_text("x")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--input", str(samples_dir / "samples.jsonl"), "--output", str(tmp_path / "afile" / "sub"),
                              "--runner", "local", "--config", "ctc_greedy"])
    assert run(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"shardscribe: error: output {tmp_path / 'afile' / 'sub'}"), err


def test_config_hash_follows_what_the_named_files_hold(tmp_path):
    """An edited phrase list or a rebuilt LM under the same path is another config (a
    resume must not mix rows of both); the same bytes hash the same."""
    from shardscribe.pipeline.config import config_hash

    phrases, lm = tmp_path / "phrases.txt", tmp_path / "lm"
    lm.mkdir()
    phrases.write_text("shardscribe\nkenlm\n")
    (lm / "lm.ngpu.safetensors").write_bytes(b"\x01" * 3_000_000)
    overrides = [f"beam.key_phrases_file={phrases}", f"beam.lm_path={lm}"]
    first = config_hash(load_config("ctc_beam", overrides))
    phrases.write_text("shardscribe\nkenlm\nparquet\n")
    edited = config_hash(load_config("ctc_beam", overrides))
    # A change past the first MiB and before the last one is not seen; one in the tail is.
    (lm / "lm.ngpu.safetensors").write_bytes(b"\x01" * 2_999_999 + b"\x02")
    rebuilt = config_hash(load_config("ctc_beam", overrides))
    assert len({first, edited, rebuilt}) == 3
    phrases.write_text("shardscribe\nkenlm\n")
    (lm / "lm.ngpu.safetensors").write_bytes(b"\x01" * 3_000_000)
    assert config_hash(load_config("ctc_beam", overrides)) == first


@pytest.mark.parametrize("family, source, key, value", [
    ("ctc", "{dir}", "ctc_head", "/nonexistent/head"),
    ("ctc", "{dir}", "ctc_head", "embedded"),
    ("transducer", "embedded", "ctc_head", "/nonexistent/head"),
    ("granite_speech", "{dir}", "ctc_head", "embedded"),
    ("whisper", "embedded", "ctc_vocab", "/x/ctc_vocab.json"),
    ("ctc", "{dir}", "ctc_vocab", "/x/ctc_vocab.json"),
    ("transducer", "embedded", "ctc_vocab", "/x/ctc_vocab.json"),
    ("ctc", "{dir}", "encoder_micro_batch", "4"),
    ("transducer", "embedded", "encoder_micro_batch", "0"),
    ("granite_speech", "{dir}", "encoder_micro_batch", "4"),
])
def test_a_model_key_the_family_does_not_read_is_refused(tmp_path, family, source, key, value):
    """model.ctc_head (Whisper), model.ctc_vocab (granite_speech) and
    model.encoder_micro_batch (Whisper) were accepted and ignored on other families, like
    model.quantize before them."""
    sets = [f"model.family={family}", f"model.source={source.format(dir=tmp_path)}", f"model.{key}={value}"]
    with pytest.raises(ConfigError) as exc:
        load_config("ar", sets)
    message = str(exc.value)
    assert message.startswith(f"model.{key}: ") and f"model.family={family}" in message and "\n" not in message


@pytest.mark.parametrize("name", ["ssd", "ctc_greedy", "ctc_beam", "default"])
def test_a_named_configs_ctc_head_is_dropped_where_set_moves_off_whisper(tmp_path, name):
    """The shipped configs' ctc_head: embedded belongs to the Whisper model they name; a
    job moved to another family by --set loses it (as --model does) instead of being refused."""
    for sets in (["model.family=granite_speech", f"model.source={tmp_path}", "model.ctc_vocab=/x.json"],
                 ["model.family=ctc", f"model.source={tmp_path}", "decoder.pack_windows=false"]):
        try:
            cfg = load_config(name, sets)
        except ConfigError as exc:  # a decoder the family cannot run, not the head
            assert "ctc_head" not in str(exc)
        else:
            assert cfg.model.ctc_head is None
    # the ctc family's embedded model is Whisper's encoder: its head stays
    assert load_config(name, ["model.family=ctc", "decoder.kind=ctc_greedy"]).model.ctc_head == "embedded"
    assert load_config("ar", ["model.family=whisper", "model.ctc_head=/some/head"]).model.ctc_head == "/some/head"


def test_beam_files_the_workers_read_are_checked_with_the_config(tmp_path):
    """A build-lm folder without its tensors, or a phrase file that is not UTF-8, is one
    line before any worker starts, not a FileNotFoundError / UnicodeDecodeError in each."""
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "lm.arpa").write_text("\\data\\\n")
    with pytest.raises(ConfigError, match=r"^beam.lm_path: .* has no lm.ngpu.safetensors") as exc:
        load_config("ctc_beam", [f"beam.lm_path={tmp_path / 'lm'}"])
    assert len(str(exc.value).splitlines()) == 1
    phrases = tmp_path / "phrases.txt"
    phrases.write_bytes("pump filter\nca\xf1on\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"^beam.key_phrases_file: .* is not UTF-8 text \(byte 14\)"):
        load_config("ctc_beam", [f"beam.key_phrases_file={phrases}"])
    phrases.write_text("pump filter\ncañon\n", encoding="utf-8")
    assert load_config("ctc_beam", [f"beam.key_phrases_file={phrases}"]).beam.key_phrases_file == str(phrases)


def test_keys_lists_every_key_a_config_has_with_its_default():
    """`shardscribe keys` is read from the config classes: every leaf key of a loaded config
    (the job's sections, every kind's section, the family's model keys) is listed once,
    with the config's default value."""
    from shardscribe.pipeline.config_keys import config_keys

    listed = {k.key: k for k in config_keys()}
    data = load_config("ar").to_dict()
    expected = {"name"} | {f"{section}.{key}" for section, values in data.items() if isinstance(values, dict)
                           for key in values}
    assert expected <= set(listed), sorted(expected - set(listed))
    assert listed["ssd.preset"].default == "high_accuracy" and listed["ssd.preset"].owner == "decoder.kind=ssd"
    assert listed["model.ctc_vocab"].owner == "model.family=granite_speech"
    assert "gate threshold" in listed["ssd.tau_ctc"].comment


def test_configs_accept_dashes_and_list_the_shipped_ones():
    from shardscribe.pipeline.config import shipped_configs

    assert load_config("ctc-beam").name == "ctc_beam"
    configs = shipped_configs()
    assert {"ar", "ssd", "ctc_beam", "transducer_beam"} <= set(configs) and all(configs.values())
    with pytest.raises(ConfigError, match="no such shipped config.*ctc_greedy"):
        load_config("sdd")
