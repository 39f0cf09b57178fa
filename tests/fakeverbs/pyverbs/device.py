from dataclasses import dataclass

from pyverbs import _fabric
from pyverbs import enums as e
from pyverbs.addr import GID
from pyverbs.pyverbs_error import PyverbsRDMAError


@dataclass
class _Dev:
    name: bytes


def get_device_list() -> list[_Dev]:
    return [_Dev(name.encode()) for name in _fabric.DEVICES]


@dataclass
class PortAttr:
    state: int
    active_mtu: int
    lid: int
    gid_tbl_len: int


@dataclass
class DeviceAttr:
    max_cqe: int
    phys_port_cnt: int
    max_qp_wr: int


class Context:
    def __init__(self, name: str = "") -> None:
        if name not in _fabric.DEVICES:
            raise PyverbsRDMAError(f"Failed to open device {name}", 19)
        self.name = name
        self.ports = _fabric.DEVICES[name]
        self.ip = _fabric.FABRIC.next_ip()

    def query_port(self, port: int) -> PortAttr:
        if not 1 <= port <= len(self.ports):
            raise PyverbsRDMAError(f"Failed to query port {port}", 22)
        return PortAttr(self.ports[port - 1], e.IBV_MTU_4096, 0, _fabric.GID_TABLE_LEN)

    def query_device(self) -> DeviceAttr:
        return DeviceAttr(max_cqe=65536, phys_port_cnt=len(self.ports), max_qp_wr=16384)

    def query_gid(self, port: int, index: int) -> GID:
        if index == 0:
            return GID("fe80:0000:0000:0000:0000:0000:0000:0001")
        if index == 1:
            a, b, c, d = self.ip
            return GID(f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}")
        return GID("0000:0000:0000:0000:0000:0000:0000:0000")

    def query_gid_type(self, port: int, index: int) -> int:
        return e.IBV_GID_TYPE_SYSFS_ROCE_V2 if index == 1 else e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1

    def close(self) -> None:
        pass
