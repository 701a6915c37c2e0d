"""A long video's decode parts: which videos are split (:func:`decode_parts`), the order the loader takes the parts
in (:class:`PartSampler`) and their join in the main process (:class:`JoiningLoader`, :func:`join_items`).

Why split: the NVDEC sessions of one process serialise (:mod:`datamodules.decode.parts` has the figures), so a long
video decoded by one worker bounds the run's feed; as parts its decode is spread over several workers. The parts of
one video are consecutive in the sampler's order (each split video followed by as many whole ones as it has parts:
:func:`interleave_parts`), so the DataLoader hands them to consecutive workers; with
``in_order=False`` they arrive in any order, and the join yields the video once all its parts are in. Whole videos
pass through unchanged. Records, resume and the per-rank shards are by video, as without parts.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence

from torch.utils.data import Sampler

from datamodules.decode.parts import PartMismatch, join_frames, join_info

log = logging.getLogger(__name__)

DECODE_PART_MB = 256.0   # data.decode_part_mb: a file larger than this is decoded in ceil(size / this) parts


def max_parts(num_workers: int) -> int:
    """The most parts one video is cut into: half the workers, at least 2 (the other half keeps decoding the videos
    around it: with all 8 workers on one long video's parts, the short videos after it waited for them, 13.5 s on
    the H100, ``bench/results/s5call2_cli_parts_h100_2026-12-06.txt``)."""
    return max(2, int(num_workers) // 2)


def decode_parts(paths: Sequence[str], part_mb: float | None, max_parts: int) -> list[int]:
    """Parts per video: ``min(max_parts, ceil(file MB / part_mb))``, at least 1; 1 for every video when ``part_mb``
    is ``None`` or ``<= 0``, and for a file that cannot be stat'ed (its decode's error record says why).

    The file size stands in for the decode work (the bits the decoder parses; a 30-minute 1080p video is several
    hundred MB, a 30-minute 360p one a few tens), and costs one ``stat`` per video, where reading each container's
    duration before the first answer would cost a demuxer open per video.
    """
    if part_mb is None or part_mb <= 0 or max_parts <= 1:
        return [1] * len(paths)
    out = []
    for p in paths:
        try:
            mb = os.path.getsize(p) / 1e6
        except (OSError, ValueError):
            mb = 0.0
        out.append(int(min(max_parts, max(1, math.ceil(mb / part_mb)))))
    return out


def within_spare_workers(counts: Sequence[int], workers: int) -> list[int]:
    """``counts`` (:func:`decode_parts`) cut down so that the parts use only the workers that would otherwise hold no
    video: the extra parts (``sum(k - 1)``) are at most ``workers - len(counts)``, given to the videos with the most
    parts first (ties by position), each as many as it asks for while they last; none when the rank has at least as
    many videos as workers.

    Why: parts shorten one long video's latency at the cost of more decode sessions beside the other videos. With
    as many videos in flight as workers the engines are the bound and the parts only add to it: on 3 copies of the
    workload set (18 videos, H100, 2026-12-06, ``bench/results/s7call2_cli_workers_h100_2026-12-06.txt``) the GPU
    waited 31.5 % after the first video with 16 workers and parts (a medium video's 3 parts started 39 s late behind
    three 30-minute videos' 8 parts each) against 10.6 % with the same workers and every video whole; on the
    6-video set (8 workers) parts took the wait from 34 % to 4-11 % (session 6). A resumed run with few videos
    left gets its parts back.

    >>> within_spare_workers([4, 1, 3], 6)   # 3 spare: the 4-part video takes them all
    [4, 1, 1]
    >>> within_spare_workers([4, 1, 3], 3)
    [1, 1, 1]
    """
    spare = max(0, int(workers) - len(counts))
    out = [1] * len(counts)
    for i in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        extra = min(max(counts[i] - 1, 0), spare)
        out[i], spare = 1 + extra, spare - extra
    return out


def interleave_parts(videos: Sequence[int], counts: Sequence[int], lead: int | None = None) -> list[int]:
    """The order the loader takes the videos in when some are decoded in parts: ``videos``' order (the rank's
    :func:`datamodules.sharding.run_order`) kept within the whole videos and within the split ones, and after a video
    of ``k`` parts the next ``k`` whole videos before the next split one (the first video whole). Once the whole
    videos run out the split ones follow back to back, and the other way round.

    Why: :func:`max_parts` keeps one video's parts to half the workers, but consecutive split videos took all of
    them: on 3 copies of the workload set (H100, 2026-12-06, ``bench/results/s6call3_cli_copies_h100_2026-12-06.json``)
    the 8 workers held the parts of two 30-minute videos after the first two short videos, and the third short video
    started 18 s late and its step waited 10.6 s. This way each part a worker takes is matched by a whole video
    for another, so short videos keep reaching the GPU while the long ones decode. ``bench/part_order_sim.py``
    replays that run's decode windows through both orders. The order changes no record.

    Args:
        videos: video indices in run order.
        counts: parts per video, indexed by video index (1: whole).
        lead: a video of ``videos`` that goes first all the same (the rank's first video read on the CPU in parts,
            ``data.first_video_parts``); the others follow as after any split video.

    Returns:
        ``videos`` reordered (each once).

    >>> interleave_parts([3, 0, 1], {0: 1, 1: 1, 3: 2}), interleave_parts([3, 0, 1], {0: 1, 1: 1, 3: 2}, lead=3)
    ([0, 3, 1], [3, 0, 1])
    """
    out, owed = [], 1
    if lead is not None and lead in videos:
        out, owed = [lead], counts[lead]
        videos = [v for v in videos if v != lead]
    whole = [v for v in videos if counts[v] <= 1]
    split = [v for v in videos if counts[v] > 1]
    i, j = 0, 0
    while i < len(split) or j < len(whole):
        if j < len(whole) and (owed > 0 or i == len(split)):
            out.append(whole[j])
            j, owed = j + 1, owed - 1
        else:
            out.append(split[i])
            owed = counts[split[i]]
            i += 1
    return out


class PartSampler(Sampler[int]):
    """The dataset's item indices, ``videos`` in :func:`interleave_parts`' order, each video expanded into its parts'
    items (``dataset.items_of``), consecutively; ``len`` counts items."""

    def __init__(self, videos: Sampler[int], dataset):
        self.videos, self.dataset = videos, dataset

    def __iter__(self) -> Iterator[int]:
        order = list(self.videos)
        counts = {v: len(self.dataset.items_of(v)) for v in order}
        first = getattr(self.dataset, "cpu_task", None)     # read on the CPU in parts: still the first
        for v in interleave_parts(order, counts, first if counts.get(first, 1) > 1 else None):
            yield from self.dataset.items_of(v)

    def __len__(self) -> int:
        return sum(len(self.dataset.items_of(v)) for v in self.videos)


def join_items(items: list[dict], dataset=None) -> dict:
    """One video's item from its parts' items (``items[k]`` is part ``k``): the frames and labels concatenated, the
    ``video_info`` of :func:`datamodules.decode.parts.join_info`, ``decode_s`` summed (worker seconds), the decode
    window from the first start to the last end, ``decode_parts`` the part count.

    Every part failing: the first part's error item. Parts that do not fit (some failed and some did not, different
    plans, positions that do not tile the plan, damaged frames read on the CPU:
    :class:`~datamodules.decode.parts.PartMismatch`; or any other error while joining): the video is decoded whole
    here, in the main process (``dataset.whole_item``; a warning names the file and why, and the item's
    ``parts_fallback`` says it: the steps wait for that decode), so its record is the whole decode's.

    Raises:
        PartMismatch: the parts do not fit and no ``dataset`` was given.
    """
    n = len(items)
    try:
        failed = [it for it in items if it.get("error")]
        if len(failed) == n:
            out = dict(failed[0])
        elif failed:
            raise PartMismatch(f"{len(failed)} of {n} parts failed ({failed[0]['error'][:200]})")
        else:
            lows = [it["part_bounds"][0] for it in items]
            ends = [it["part_bounds"][1] for it in items]
            total = items[0]["video_info"]["n_frames"]
            if lows[0] != 0 or ends[-1] != total or any(a != b for a, b in zip(ends, lows[1:])):
                raise PartMismatch(f"part bounds {list(zip(lows, ends))} do not tile {total} planned frames")
            out = dict(items[0])
            # an empty part (fewer planned frames than parts) read nothing: its reader and flags say nothing
            full = [(it["video_info"], lo) for it, lo, hi in zip(items, lows, ends) if hi > lo]
            out["video_info"] = join_info([i for i, _ in full], [lo for _, lo in full])
            out["frames"] = join_frames([it["frames"] for it in items], lows, total)
            out["times_s"] = [t for it in items for t in it["times_s"]]
    except Exception as e:  # noqa: BLE001 - whatever keeps the parts apart, the whole decode is the record's source
        if dataset is None:
            raise
        it = items[0]
        first = (str(e).splitlines() or [""])[0][:200]
        why = str(e) if isinstance(e, PartMismatch) else f"{type(e).__name__}: {first}"
        log.warning("%s: its %d decode parts do not fit together (%s): decoding it whole in the main process",
                    it["video_path"], n, why)
        out = dataset.whole_item(it["task"])
        out.update(decode_parts=1, parts_fallback=why,
                   decode_s=out["decode_s"] + sum(i.get("decode_s", 0.0) for i in items))   # the parts' work too
        return out
    starts = [it["decode_boot_s"][0] for it in items]
    ends_s = [it["decode_boot_s"][1] for it in items]
    out.update(decode_s=sum(it["decode_s"] for it in items), decoded_unix=max(it["decoded_unix"] for it in items),
               decode_boot_s=(min(starts), max(ends_s)),
               worker_start_boot_s=min(it["worker_start_boot_s"] for it in items), decode_parts=n)
    for k in ("part", "part_bounds", "task"):
        out.pop(k, None)
    return out


class JoiningLoader:
    """Iterates ``loader`` (items of a dataset with parts) and yields one item per video: a whole video's item as
    it comes, a split one's once all its parts have come (:func:`join_items`). ``len`` is the videos'.

    ``iter()`` starts the loader's iterator (its workers) at once, as iterating a DataLoader does; an iterator that
    nobody read from is handed to the next ``iter()`` instead of starting a second one. Lightning calls ``iter()``
    once only to check that a loader that is not a DataLoader is iterable (``_check_dataloader_iterable``) and drops
    the result: without the hand-over that started 8 workers, dropped them mid-decode and started 8 more
    (first worker 17.8 s late on the H100, 2026-12-06). The unread iterator is kept as ``_iterator``, the name
    Lightning's loop teardown looks for (``_shutdown_workers_and_reset_iterator``): a run that fails before its
    first item (the weight load in ``on_predict_start``) shuts its workers down as with a DataLoader.

    Raises (while iterating):
        RuntimeError: the loader ended with a video's parts missing (a sampler that did not give them all).
    """

    def __init__(self, loader, dataset, num_videos: int):
        self.loader, self.dataset, self.num_videos = loader, dataset, num_videos
        self._iterator = None        # the loader's iterator made by the last iter(), until its first item is read

    def __len__(self) -> int:
        return self.num_videos

    def __iter__(self) -> Iterator[dict]:
        if self._iterator is None:
            self._iterator = iter(self.loader)
        return self._joined()

    def _take(self):
        items, self._iterator = self._iterator, None
        return items if items is not None else iter(self.loader)

    def _joined(self) -> Iterator[dict]:
        pending: dict[int, dict[int, dict]] = {}
        for item in self._take():
            part = item.get("part")
            if part is None:
                yield item
                continue
            k, n = part
            got = pending.setdefault(item["task"], {})
            got[k] = item
            if len(got) == n:
                del pending[item["task"]]
                yield join_items([got[j] for j in range(n)], self.dataset)
        if pending:
            names = [self.dataset.tasks[t].video_path for t in pending]
            raise RuntimeError(f"the loader ended with decode parts missing for {names[:3]}")
