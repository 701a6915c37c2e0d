"""Does PyNvVideoCodec's demuxer seek land where a packet-fed NVDEC session needs it? (issue 40 lever: no session
demuxes from the start of the file). For a video and a few target times: ``CreateDemuxer(path).Seek(t)``'s
returned packet (pts, key flag as PyAV sees that pts) and whether the packets that follow are PyAV's packets in
PyAV's order from there, and how long it took against demuxing from the start up to the same packet.

    python bench/demux_seek_probe.py VIDEO [SECONDS ...]

Measured on the lent H100 (2026-12-06, PyNvVideoCodec 2.2.4, the workload's 30-minute 1080p H.264 file,
``bench/results/s4call2_seek_h100_2026-12-06.txt``): ``Seek`` takes an ``int`` only (a float is a ``TypeError``);
``Seek(0)`` returns the first packet and the next 30 follow in PyAV's order, but ``Seek(1830000)`` (the pts of 61 s
in the stream's 1/30000 time base) raises ``PyNvVCException`` (error code 1). The unit is not documented, so the
packet-fed sessions still demux from the start (about 0.75 s of a session's 14 s on that file).
"""
from __future__ import annotations

import sys
import time


def main(argv=None) -> None:
    argv = argv or sys.argv[1:]
    path, targets = argv[0], [float(x) for x in argv[1:]] or [0.0, 60.0, 900.0]
    import av
    import PyNvVideoCodec as nvc

    with av.open(path) as c:
        s = c.streams.video[0]
        tb = float(s.time_base)
        order = [(int(p.pts), bool(p.is_keyframe)) for p in c.demux(s) if p.size]
    where = {pts: i for i, (pts, _) in enumerate(order)}
    print(f"{path}: {len(order)} packets, time base {tb}")
    for t in targets:
        for unit, arg in (("seconds", t), ("pts", int(round(t / tb)))):
            dmx = nvc.CreateDemuxer(path)
            t0 = time.perf_counter()
            try:
                first = dmx.Seek(arg)
            except Exception as e:  # noqa: BLE001 - reported
                print(f"  Seek({arg!r}) [{unit}]: {type(e).__name__}: {e}")
                continue
            seek_s = time.perf_counter() - t0
            got = [int(first.pts)]
            for k, p in enumerate(dmx):
                if int(p.bsl) == 0 or k >= 30:
                    break
                got.append(int(p.pts))
            i = where.get(got[0])
            same = i is not None and [pts for pts, _ in order[i:i + len(got)]] == got
            key = order[i][1] if i is not None else None
            t1 = time.perf_counter()
            n = 0
            if i is not None:
                for p in nvc.CreateDemuxer(path):
                    n += 1
                    if n > i:
                        break
            print(f"  Seek({arg!r}) [{unit}] in {seek_s * 1e3:.1f} ms: first packet pts {got[0]} "
                  f"({got[0] * tb:.2f} s, PyAV index {i}, key {key}); next {len(got) - 1} packets in PyAV's order: "
                  f"{same}; demux from the start to it: {time.perf_counter() - t1:.2f} s ({n} packets)")


if __name__ == "__main__":
    main()
