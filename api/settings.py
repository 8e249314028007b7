"""Service settings (env prefix ``NPUPORT_``): declared with every other NPUPORT_* variable in
knowledge/settings.py (``ServiceSettings``); re-exported here as ``Settings`` for the service.

Environment examples::

    NPUPORT_HOME=/srv/npuport
    NPUPORT_TOKENS='{"s3cret-admin": ["read", "write"], "s3cret-viewer": ["read"]}'
    NPUPORT_ALLOWED_ROOTS=/models:/data/models      # or a JSON list
    NPUPORT_WORKERS=2
"""

from __future__ import annotations

from knowledge.settings import SCOPES
from knowledge.settings import ServiceSettings as Settings

__all__ = ["SCOPES", "Settings"]
