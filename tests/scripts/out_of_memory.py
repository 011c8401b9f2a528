"""A script that runs out of memory for real: an allocation no host can satisfy."""

buffers = [bytearray(1 << 44)]  # 16 TiB
