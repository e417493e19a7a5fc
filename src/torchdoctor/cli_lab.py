"""CLI command module (registers on torchdoctor.cli.cli)."""

from __future__ import annotations
