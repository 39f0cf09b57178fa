from pyverbs import enums as e
from pyverbs.pyverbs_error import PyverbsUserError


class SGE:
    def __init__(self, addr: int, length: int, lkey: int) -> None:
        self.addr, self.length, self.lkey = addr, length, lkey

    def close(self) -> None:
        pass


class RecvWR:
    def __init__(self, wr_id: int = 0, num_sge: int = 0, sg=None, next_wr=None) -> None:
        if num_sge < 1 or not sg:
            raise PyverbsUserError("A WR needs at least one SGE")
        # pyverbs copies the SGEs into the WR
        self.wr_id, self.sg = wr_id, [SGE(s.addr, s.length, s.lkey) for s in sg[:num_sge]]
        self.next_wr = next_wr

    def close(self) -> None:
        pass


class SendWR:
    def __init__(self, wr_id: int = 0, opcode: int = e.IBV_WR_SEND, num_sge: int = 0,
                 imm_data: int = 0, sg=None, send_flags: int = e.IBV_SEND_SIGNALED,
                 next_wr=None) -> None:
        if num_sge < 1 or not sg:
            raise PyverbsUserError("A WR needs at least one SGE")
        self.wr_id, self.opcode, self.imm_data, self.send_flags = wr_id, opcode, imm_data, send_flags
        self.sg = [SGE(s.addr, s.length, s.lkey) for s in sg[:num_sge]]
        self.num_sge = num_sge
        self.next_wr = next_wr
        self.remote_addr = self.rkey = 0

    @property
    def sg_list(self):
        return self.sg[0]

    @sg_list.setter
    def sg_list(self, sge: SGE) -> None:
        # pyverbs points the WR at the SGE's own memory: from rdma-core versions whose objects
        # free their memory on destruction, both would free it. Counted, so tests can refuse.
        from pyverbs import _fabric

        _fabric.FABRIC.stats.aliased_sges += 1
        self.sg = [sge]

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        self.rkey, self.remote_addr = rkey, addr

    def close(self) -> None:
        pass
