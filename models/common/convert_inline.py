# SPDX-License-Identifier: Apache-2.0
"""Inline conversion: the family's ``convert`` on the build's own thread (a :class:`~models.common.converter.Converter`).

The one strategy that can keep what it converts: a cold load onto a device keeps each weight
there, and a build that cannot write the cache keeps them in memory. Streaming (a seed, a cold
load on the host), it keeps nothing and releases each weight's checkpoint pages once it is handed
to the writer, the host weights' only after the host sidecar is written (its writer reads them).
"""

from __future__ import annotations

import time

from models.common.conversion import LazyStateDict, WeightSink
from models.common.converter import STREAM_PENDING_BYTES, Build, Converted
from models.common.weight_cache.tensor_cache import TensorCache, conversion_threads


class InlineConverter:
    """Converts every weight on this thread, through one :class:`WeightSink`."""

    def convert(self, build: Build) -> Converted:
        loader = build.loader
        with TensorCache(build.root, loader.mesh_shape, rebuild=True, mesh_device=loader.mesh_device,
                         max_pending_bytes=STREAM_PENDING_BYTES if build.streaming else None,
                         on_written=build.on_written) as cache:
            sink = WeightSink(cache, LazyStateDict(build.reader), (), keep=not build.streaming)
            sink.host, sink.sidecar = build.host, build.sidecar
            with conversion_threads():
                loader.convert(sink, build.args)
            converted_at = time.perf_counter()
            written = cache.finish()
        timings = {"convert": converted_at - build.start, "from_torch": cache.convert_seconds,
                   "writer_wait": cache.wait_seconds, "dump": cache.dump_seconds, "fsync": cache.fsync_seconds}
        return Converted(written, list(cache.write_errors), timings, sink.weights, sink.formats)
