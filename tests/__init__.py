"""Tests mirror the packages of src/simtune/ (top level: the core and the whole pipeline)."""
