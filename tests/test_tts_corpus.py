"""The synthetic corpus: spoken forms, Whisper-style transcripts, splits, augmentation, TTS."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from shardscribe.pipeline.training.tts import augment, corpus, domain_text, engines, text_sources

# Independent reference values for the number reader.
KNOWN_NUMBERS = {
    "0": "zero", "7": "seven", "13": "thirteen", "20": "twenty", "45": "forty five",
    "100": "one hundred", "101": "one hundred one", "999": "nine hundred ninety nine",
    "1000": "one thousand", "1250": "one thousand two hundred fifty",
    "3600": "three thousand six hundred", "3.5": "three point five",
    "0.25": "zero point two five", "11.8": "eleven point eight", "20.0": "twenty point zero",
}


@pytest.mark.parametrize("digits,words", sorted(KNOWN_NUMBERS.items()))
def test_number_to_words(digits, words):
    assert domain_text.number_to_words(digits) == words


def test_domain_sentences_have_digit_transcripts_and_wordy_speech():
    sents = domain_text.domain_sentences(300, seed=3)
    assert len(sents) == 300 and len({s["text"] for s in sents}) == 300
    with_digits = 0
    for s in sents:
        assert not re.search(r"\d|%", s["spoken"]), s
        assert s["text"][0].isupper() and s["text"][-1] == "."
        assert all(32 <= ord(c) < 127 for c in s["text"])
        with_digits += bool(re.search(r"\d", s["text"]))
        # Undo the spoken forms on the transcript: words and digits must line up.
        rebuilt = re.sub(r"\d+(\.\d+)?", lambda m: domain_text.number_to_words(m.group()), s["text"])
        rebuilt = rebuilt.replace("%", " percent").replace("PSI", "P S I").replace("RPM", "R P M")
        assert rebuilt == s["spoken"]
    assert with_digits > 100
    assert domain_text.domain_sentences(50, seed=3) == sents[:50]


def test_clean_sentence_rejects_code_and_keeps_prose():
    ok = text_sources.clean_sentence("the loop runs until the iterator is exhausted.")
    assert ok == "The loop runs until the iterator is exhausted."
    for bad in ["Call foo_bar to start the loop now.", "Returns x + y for the two values.",
                "See PEP 8 for the full details here.", "Use getattr(obj, name) or x[0] here now.",
                "The NaN value is not equal to itself.", "Too short."]:
        assert text_sources.clean_sentence(bad) is None, bad


def test_splits_are_disjoint_and_stable():
    jobs = corpus.plan_corpus(120, seed=5, num_heldout_voice=20, num_heldout_text=20)
    again = corpus.plan_corpus(120, seed=5, num_heldout_voice=20, num_heldout_text=20)
    assert [(j.text, j.voice, j.seed) for j in jobs] == [(j.text, j.voice, j.seed) for j in again]
    train = [j for j in jobs if j.split == "train"]
    assert len(train) == 80
    assert not any(corpus.is_heldout_voice(j.voice) or corpus.is_heldout_text(j.text) for j in train)
    assert all(corpus.is_heldout_voice(j.voice) for j in jobs if j.split == "heldout_voice")
    assert all(corpus.is_heldout_text(j.text) and not corpus.is_heldout_voice(j.voice)
               for j in jobs if j.split == "heldout_text")
    assert not any(j.augment for j in jobs if j.split != "train")


def test_augmentations_keep_length_and_level():
    rng = np.random.default_rng(0)
    audio = np.sin(np.linspace(0, 2000, 16000)).astype(np.float32) * 0.5
    fast = augment.change_speed(audio, 1.1)
    assert abs(len(fast) - 16000 / 1.1) < 50
    noisy = augment.add_noise(audio, rng, snr_db=20.0, exponent=1)
    snr = 10 * np.log10(np.mean(audio ** 2) / np.mean((noisy - audio) ** 2))
    assert abs(snr - 20.0) < 0.5
    rir = augment.synthetic_rir(rng, rt60=0.4, direct_ratio_db=3.0)
    assert rir[0] == 1.0 and len(rir) == int(0.4 * 16000)
    tail_energy = np.sum(rir[1:] ** 2)
    assert abs(10 * np.log10(1.0 / tail_energy) - 3.0) < 1e-3
    out, applied = augment.augment(audio, rng)
    assert out.dtype == np.float32 and np.abs(out).max() <= 1.0
    assert abs(20 * np.log10(np.abs(out).max()) - applied["peak_db"]) < 0.5


@pytest.mark.parametrize("voice", [engines.Voice("flite", "slt", rate=1.1),
                                   engines.Voice("espeak-ng", "en-us+m3", pitch=40)])
def test_engines_render_speech(voice):
    if shutil.which(voice.engine) is None:
        pytest.fail(f"{voice.engine} missing: run scripts/setup.sh")
    audio = engines.synthesize(voice, "Check the valve --help twice.")
    assert audio.dtype == np.float32 and 0.8 < len(audio) / 16000 < 5
    assert np.abs(audio).max() > 0.05


def test_render_writes_a_manifest_row(tmp_path):
    (tmp_path / "audio").mkdir()
    job = corpus.Job(id="t0", split="train", domain="maintenance", text="Check pump 4.",
                     spoken="Check pump four.", voice=engines.Voice("flite", "kal"),
                     augment=True, seed=1)
    row = corpus.render(job, str(tmp_path))
    assert "error" not in row, row
    assert (tmp_path / row["audio"]).exists() and row["text"] == "Check pump 4."
    assert set(row) >= {"id", "audio", "text", "voice", "split", "domain", "duration"}


def test_the_docstring_walk_visits_what_ast_walk_visits_in_its_order():
    """The statement-only walk behind the text pool against ast.walk over every node, on
    modules with nested, decorated, conditional, exception-handler and match-case definitions."""
    import ast
    import inspect
    import json as json_module
    import textwrap

    import email.message

    src = textwrap.dedent('''
        """Module."""
        try:
            import x
        except ImportError:
            def f():
                """In a handler."""
        if True:
            class A:
                """A."""
                @staticmethod
                def g(y=lambda: 1):
                    """G."""
                    async def h():
                        """H."""
                match y:
                    case 1:
                        def k():
                            """K."""
        def top():
            """Top."""
        ''')
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for source in (src, inspect.getsource(json_module), inspect.getsource(email.message)):
        tree = ast.parse(source)
        expected = [n for n in ast.walk(tree) if isinstance(n, documented)]
        assert list(text_sources._documented_nodes(tree)) == expected
    assert len(expected) > 20
