"""Measured per-tensor mixes (issue #19 part 2, docs/mixes.md): groups, the sensitivity stage, the solve stage."""
