"""The files that make a node's SoftRoCE device, from templates, delivered two ways: the
systemd unit and the udev rule that starts it when the data NIC appears (an event, so no
timeout: a NIC renamed minutes late on a busy host still gets its device), and the .link
files that name a node's NICs by MAC whenever they appear.

Debian's image is ours: the unit and the rule are baked in when the image is built, so a boot
needs no runcmd and no `systemctl daemon-reload` (under TCG those cost ~9 s of guest CPU, on
the critical path). Ubuntu's cloud image is not ours to build: cloud-init writes the same files
there. The .link files carry each node's MACs, so cloud-init writes them on every image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

import jinja2

from infra.config import DATA_NIC, RDMA_DEVICE, REPO

TEMPLATES = REPO / "cloud-init"
UNIT = f"{RDMA_DEVICE}.service"
RULE = f"90-rxelab-{RDMA_DEVICE}.rules"


@dataclass(frozen=True)
class GuestFile:
    path: PurePosixPath  # where it goes in the guest
    text: str

    @property
    def name(self) -> str:
        return self.path.name


def _render(template: str, **context: str) -> str:
    return jinja2.Template((TEMPLATES / template).read_text(), undefined=jinja2.StrictUndefined,
                           keep_trailing_newline=True).render(**context)


def rdma_device_files() -> tuple[GuestFile, GuestFile]:
    """(the unit, the udev rule that starts it)."""
    context = {"device": RDMA_DEVICE, "netdev": DATA_NIC, "unit": UNIT, "rule": RULE}
    return (GuestFile(PurePosixPath("/etc/systemd/system") / UNIT,
                      _render("rdma-device.service.j2", **context)),
            GuestFile(PurePosixPath("/etc/udev/rules.d") / RULE,
                      _render("rdma-device.rules.j2", **context)))


def nic_name_link(name: str, mac: str) -> GuestFile:
    """A .link file that names the NIC with this MAC."""
    return GuestFile(PurePosixPath("/etc/systemd/network") / f"10-rxelab-{name}.link",
                     _render("nic-name.link.j2", name=name, mac=mac))
