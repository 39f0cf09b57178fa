class GID:
    def __init__(self, val: str = "") -> None:
        self.gid = val

    def __str__(self) -> str:
        return self.gid


class GlobalRoute:
    def __init__(self, dgid: GID | None = None, flow_label: int = 0, sgid_index: int = 0,
                 hop_limit: int = 1, traffic_class: int = 0) -> None:
        self.dgid, self.sgid_index, self.hop_limit = dgid, sgid_index, hop_limit


class AHAttr:
    def __init__(self, dlid: int = 0, sl: int = 0, port_num: int = 1, is_global: int = 0,
                 gr: GlobalRoute | None = None, **_: object) -> None:
        self.dlid, self.port_num, self.is_global, self.gr = dlid, port_num, is_global, gr
