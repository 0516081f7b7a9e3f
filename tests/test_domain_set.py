"""The in-domain announcement set: held-out sentences never appear on the train side,
the engines get words for every number, and a seed gives the same sentences."""
from __future__ import annotations

import re

from shardscribe.pipeline.training.tts.announcements import announcements, is_heldout_announcement


def test_train_and_heldout_sentences_are_disjoint_and_stable():
    train, held = announcements(300, 0, heldout=False), announcements(60, 0, heldout=True)
    assert len({s["text"] for s in train}) == 300 and len({s["text"] for s in held}) == 60
    assert not {s["text"] for s in train} & {s["text"] for s in held}
    assert all(is_heldout_announcement(s["text"]) for s in held)
    assert not any(is_heldout_announcement(s["text"]) for s in train)
    assert announcements(60, 0, heldout=True) == held
    assert announcements(60, 1, heldout=True) != held


def test_spoken_form_has_no_digits_and_text_keeps_whisper_numbers():
    sents = announcements(200, 3, heldout=False)
    assert not any(re.search(r"\d", s["spoken"]) for s in sents)
    assert any(re.search(r"\b\d{1,2}:\d\d\b", s["text"]) for s in sents)        # clock times as digits
    assert any("platform" in s["text"] and re.search(r"platform \d+", s["text"]) for s in sents)
    assert len({s["kind"] for s in sents}) == 6
