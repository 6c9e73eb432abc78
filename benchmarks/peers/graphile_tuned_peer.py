"""Graphile Worker with the preset of its performance page (24 jobs at once, a local queue of 500, batched finishes)."""

from __future__ import annotations

from benchmarks.peers import graphile_peer


class Peer(graphile_peer.Peer):
    preset = "tuned"
