"""The conformance suite for every registered backend, sync and async.

The classes are generated from the registry: a backend registered tomorrow (built in or through
the `sessionlog` entry-point group) is tested with no change here.
"""

from __future__ import annotations

from conftest import FIXTURES
from sessionlog.testing import contract_classes

globals().update(contract_classes(fixture_dir=FIXTURES))
