#!/bin/bash
# tcp-basic with NVMe/TCP header and data digests (CRC32C, NVMe-TCP 1.0 §3.6.2.3 / §3.6.3.3)
# negotiated at connect; fio crc32c verification on the RAM namespace.
E2E_DIGESTS=1
FIO_NSIDS=1
. "$E2E_DIR/scenarios/tcp-basic.sh"
