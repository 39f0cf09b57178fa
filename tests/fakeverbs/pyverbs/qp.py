from pyverbs import _fabric
from pyverbs import enums as e
from pyverbs.pyverbs_error import PyverbsRDMAError


class QPCap:
    def __init__(self, max_send_wr: int = 1, max_recv_wr: int = 10, max_send_sge: int = 1,
                 max_recv_sge: int = 1, max_inline_data: int = 0) -> None:
        self.max_send_wr, self.max_recv_wr = max_send_wr, max_recv_wr
        self.max_inline_data = max_inline_data


class QPInitAttr:
    def __init__(self, qp_type: int = e.IBV_QPT_RC, qp_context=None, scq=None, rcq=None,
                 srq=None, cap: QPCap | None = None, sq_sig_all: int = 1) -> None:
        self.qp_type, self.scq, self.rcq = qp_type, scq, rcq
        self.cap, self.sq_sig_all = cap or QPCap(), sq_sig_all


class QPAttr:
    def __init__(self, qp_state: int = e.IBV_QPS_INIT, cur_qp_state: int = e.IBV_QPS_RESET,
                 port_num: int = 1, **_: object) -> None:
        self.port_num = port_num
        self.qp_access_flags = 0
        self.dest_qp_num = 0
        self.timeout = 14
        self.retry_cnt = 7
        self.rnr_retry = 7


class QP:
    def __init__(self, pd, init_attr: QPInitAttr, qp_attr=None) -> None:
        cap = init_attr.cap
        if cap.max_inline_data > _fabric.MAX_INLINE:
            raise PyverbsRDMAError("Failed to create QP", 22)
        self.pd, self.init = pd, init_attr
        self.state = e.IBV_QPS_RESET
        self.qp_num = _fabric.FABRIC.add_qp(self)
        self.remote_qpn = 0
        self.access = 0
        self.recvs: list = []  # posted RecvWRs, in order
        self.sq_used = 0  # send queue slots not yet released by a polled completion
        self.unsignaled_done = 0
        self.attr: QPAttr | None = None

    def to_init(self, attr: QPAttr) -> None:
        self.access = attr.qp_access_flags
        self.state = e.IBV_QPS_INIT

    def to_rts(self, attr: QPAttr) -> None:
        if self.state != e.IBV_QPS_INIT:
            raise PyverbsRDMAError("Failed to modify QP state to RTR", 22)
        self.remote_qpn = attr.dest_qp_num
        self.access = attr.qp_access_flags
        self.attr = attr
        self.state = e.IBV_QPS_RTS

    def post_recv(self, wr, bad_wr=None) -> None:
        if self.state == e.IBV_QPS_RESET:
            raise PyverbsRDMAError("Failed to post recv", 22)  # as rxe: INIT first
        _fabric.FABRIC.post_recv(self, wr)

    def post_send(self, wr, bad_wr=None) -> None:
        _fabric.FABRIC.post_send(self, wr)

    def close(self) -> None:
        _fabric.FABRIC.remove_qp(self)
