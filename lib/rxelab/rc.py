"""The RC transport's timers, one place for the library's queue pairs (rxelab.verbs) and for
perftest's (rxelab.perftest): a link limit measured with a shorter ack timeout than the
library's would fail where the library does not (under TCG, crowded VMs answer late and rxe
exhausts its retries at perftest's default 67 ms: `Failed status 9`). Pure Python."""

QP_TIMEOUT = 16  # 4.096 us * 2^16 = 268 ms per ack timeout: generous under emulation
RETRY_CNT = 7  # retransmissions (go-back-N) before the QP goes to error
