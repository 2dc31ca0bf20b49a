#!/usr/bin/env bash
# The property tests and the optimizer lifecycle fuzz under hypothesis' "thorough" profile
# (tests/conftest.py: ten times the examples of CI's profile, freshly random each run): run
# before a submission; extra arguments go to pytest (e.g. -x, -k NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
HYPOTHESIS_PROFILE=thorough exec python -m pytest -q -p no:cacheprovider \
    tests/test_properties.py tests/test_properties_inputs.py tests/test_properties_formats.py \
    tests/test_optim_lifecycle.py tests/test_testing.py "$@"
