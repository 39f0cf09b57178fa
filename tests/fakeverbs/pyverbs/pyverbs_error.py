class PyverbsError(Exception):
    pass


class PyverbsRDMAError(PyverbsError):
    def __init__(self, msg: str, error_code: int = -1) -> None:
        super().__init__(f"{msg}. Errno: {error_code}")
        self.error_code = error_code


class PyverbsUserError(PyverbsError):
    pass
