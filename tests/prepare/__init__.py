"""Tests of simtune.prepare."""
