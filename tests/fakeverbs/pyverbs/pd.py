class PD:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.closed = False

    def close(self) -> None:
        self.closed = True
