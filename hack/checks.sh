#!/usr/bin/env bash
# The static checks CI runs before the tests, each command written once: hack/test.sh runs them
# all, the pre-commit hooks (.pre-commit-config.yaml) one each, and the pre-push hook the unit tests.
#
# Usage: hack/checks.sh [CHECK...]   with no CHECK: every check CI runs, in order
#        hack/checks.sh --list       the checks CI runs, one a line (tests/unit/test_habits.py reads them)
# Uses the venv of hack/env.sh as it is: it installs nothing (hack/test.sh does, before calling this).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"

CI_CHECKS=(ruff imports types docs)

run_check() {
    case "$1" in
        ruff) "$VENV/bin/ruff" check . ;;
        imports) "$VENV/bin/lint-imports" ;;
        # Its cache beside the venv, outside the clone: a clean clone of CI checks in ~1 s, not ~15.
        types) "$VENV/bin/mypy" --cache-dir "$MURALIST_CACHE/mypy" ;;
        # The docs site (mkdocs.yml): the generated reference current, then a strict build, which
        # refuses a broken link or anchor; offline and about a second. The site goes to a temporary folder.
        # Not --quiet: it hides the warnings from strict mode's count, and the build passes with them.
        docs) "$VENV/bin/python" hack/docs_reference.py --check
              site=$(mktemp -d)
              NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --site-dir "$site" || { rm -rf "$site"; return 1; }
              rm -rf "$site" ;;
        # Not in CI_CHECKS: CI runs the unit tests with every other tier, in hack/test.sh's pytest.
        unit) "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/unit ;;
        *) echo "hack/checks.sh: unknown check '$1'; one of ${CI_CHECKS[*]} unit" >&2; return 2 ;;
    esac
}

if [ "${1:-}" = "--list" ]; then
    printf '%s\n' "${CI_CHECKS[@]}"
    exit 0
fi
for check in "${@:-${CI_CHECKS[@]}}"; do
    run_check "$check"
done
