from __future__ import annotations

import pytest

from resources.k8s.manifests import PodSettings
from tests.k8s.helpers import pod_settings


@pytest.fixture
def settings() -> PodSettings:
    return pod_settings()
