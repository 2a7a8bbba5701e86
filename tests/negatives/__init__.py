"""Tests of simtune.negatives."""
