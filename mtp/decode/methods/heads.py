"""The target's own heads as a decoding method (self-speculative decoding): their settings are the plan's, and they
draft inside the target's step, with no drafter. Their proposers are in :mod:`mtp.decode.heads_proposer` (the loop
builds them on the form it packs); how a run chooses its heads' part (a count, a tree) is
:mod:`mtp.decode.heads_choice`'s."""

from __future__ import annotations

from mtp.decode.methods.base import DecodingMethod, Target, register
from mtp.decode.settings import HeadsSettings


@register
class Heads(DecodingMethod):
    """The target's heads draft: heads 2..k propose, head 1 verifies (Stern et al. 2018, Gloeckle et al. 2024)."""

    name = "heads"
    settings = HeadsSettings
    selected_by = None

    def proposer(self, target: Target):
        raise TypeError("the heads draft inside the target's step; their settings are the plan's, with no drafter")
