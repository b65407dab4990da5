"""Test-only code in the runtime: failure injection (faults: ranks that die, hang or render NaN on cue, set
by MURALIST_TEST_*) and the zygote (zygote: ranks forked from a warm interpreter, so a test session pays
torch's imports once)."""
