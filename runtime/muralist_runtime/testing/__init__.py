"""Test-only code in the runtime: failure injection (faults: ranks that die, hang or render NaN on cue, set
by MURALIST_TEST_*). The zygote the test session forks its ranks from is the pods' own (world/zygote.py)."""
