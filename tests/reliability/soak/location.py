"""The soak's platform code location (``location_name: platform`` in the workspace the soak
writes): digits and wine on the soak's resources, built as pipelines/definitions.py builds the
platform's own (housekeeping and alerts included)."""

from pipelines.definitions import build_definitions
from tests.reliability.soak.pipelines import DIGITS, WINE
from tests.reliability.soak.profile import soak_profile

defs = build_definitions(soak_profile(), [DIGITS, WINE], with_yaml=False)
