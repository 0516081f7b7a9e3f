"""pytest plugin for scripts/sanitize_native.sh: the native CTC loop is built (under its
own cache key: the flags are part of it) with AddressSanitizer and UBSan."""
import shardscribe.pipeline.decoding.ctc_beam.loop_native as loop_native

loop_native.CFLAGS = loop_native.CFLAGS + ("-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                                           "-fno-sanitize-recover=undefined")
