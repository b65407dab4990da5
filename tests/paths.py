"""Where the repository and the tests' fixtures are, for tests at any depth of tests/."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
