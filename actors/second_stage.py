"""Which actor finishes the pending segments of a two-stage decoder kind (one place for
the Ray plan and the in-process runner)."""
from __future__ import annotations

from actors.ctc_beam import CTCBeamDecoder
from actors.ssd_fallback import SSDFallback

SECOND_STAGE = {"ssd": SSDFallback, "ctc_beam": CTCBeamDecoder}
