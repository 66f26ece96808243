"""Runs at interpreter start for processes with this folder on PYTHONPATH.

Only the live-tier server is started that way (engine_adapter.live.server);
it sets KVSPEC_TORCHVISION_STUB=1. See kvspec_torchvision_stub.py for why.
"""

import os

if os.environ.get("KVSPEC_TORCHVISION_STUB") == "1":
    import kvspec_torchvision_stub

    kvspec_torchvision_stub.install()
