"""Failure injection for tests (faults): ranks that die, hang or render NaN on cue, set by MURALIST_TEST_*."""
