"""The systemd unit that makes a node's SoftRoCE device, from one template, delivered two ways.

Debian's image is ours: the unit is baked in and enabled when the image is built, so a boot
needs no runcmd and no `systemctl daemon-reload` (under TCG those cost ~9 s of guest CPU, on
the critical path). Ubuntu's cloud image is not ours to build: cloud-init writes the same unit
there and enables it on first boot.
"""

from __future__ import annotations

import jinja2

from infra.config import DATA_NIC, RDMA_DEVICE, REPO

TEMPLATE = REPO / "cloud-init" / "rdma-device.service.j2"


def rdma_device_unit() -> tuple[str, str]:
    """(unit file name, text)."""
    template = jinja2.Template(TEMPLATE.read_text(), undefined=jinja2.StrictUndefined,
                               keep_trailing_newline=True)
    return f"{RDMA_DEVICE}.service", template.render(device=RDMA_DEVICE, netdev=DATA_NIC)
