"""One JSONL record of a multi-image / video conversation -> checked turns, image paths and videos.

Record: the LLaVA/ShareGPT layout that ``records.py`` reads, extended to videos and any number of media per turn::

    {"id": ..., "image": "a.jpg" | ["a.jpg", "b.jpg"], "video": "clip.mp4" | "frames_dir" | ["dir1", ["f1.jpg",
     "f2.jpg"]], "fps": 2.0, "conversations": [{"from": "human", "value": "<image>\\n<video>\\n..."}, ...]}

``video``: one video (a string) or a list of videos, each a video file (read with PyAV), a folder of frame images
(sorted by name) or a list of frame files; so the frames of one video given as files go in a nested list.
``fps``: the frames' rate after sampling (default from the loader's config), one number or one per video.
``<image>``/``<video>`` tags go in user turns, one per listed image/video, in order; a record with media and no
tag at all gets them (images, then videos, one per line) prepended to its first user turn, as LLaVA does.
Roles and turn order are checked as in ``records.py``. Every problem is a ``BadSample`` naming file, line and id.
May assume: nothing about the record (it comes from a user's file).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from mtmegatron.data.vision.dynamic_resolution import FRAME_SUFFIXES
from mtmegatron.data.vision.records import BadSample, parse_turns
from mtmegatron.data.vision.template import IMAGE_TAG, Turn

VIDEO_TAG = "<video>"


@dataclass(frozen=True)
class VisionRecord:
    sample_id: object
    turns: list[Turn]
    images: list[str]  # absolute paths
    videos: list  # each an absolute path (file or frame folder) or a list of absolute frame paths
    fps: list[float]  # one per video


def parse_vision_line(line: str, path: str, number, media_folder: str, default_fps: float) -> VisionRecord:
    """The record on JSONL line ``number`` (1-based) of ``path``, checked."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadSample(path, number, None, f"malformed JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise BadSample(path, number, None, "not a JSON object")
    sample_id = record.get("id")

    def bad(reason: str) -> BadSample:
        return BadSample(path, number, sample_id, reason)

    images = _names(record.get("image"), "image", bad)
    videos = _videos(record.get("video"), bad)
    fps = _fps(record.get("fps", default_fps), len(videos), bad)
    turns = parse_turns(record.get("conversations"), bad)
    turns = _placed_tags(turns, len(images), len(videos), bad)

    def absolute(name: str) -> str:
        return os.path.join(media_folder, name)

    videos = [[absolute(f) for f in v] if isinstance(v, list) else absolute(v) for v in videos]
    return VisionRecord(sample_id, turns, [absolute(i) for i in images], videos, fps)


def _names(value, key: str, bad) -> list[str]:
    if value is None:
        return []
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise bad(f"'{key}' must be a file name or a list of file names")
    return names


def _videos(value, bad) -> list:
    if value is None:
        return []
    videos = [value] if isinstance(value, str) else value
    if not isinstance(videos, list):
        raise bad("'video' must be a video (file, frame folder) or a list of videos")
    for k, video in enumerate(videos):
        if isinstance(video, list):
            if not video:
                raise bad(f"video {k + 1} has no frames")
            if not all(isinstance(f, str) and f for f in video):
                raise bad(f"video {k + 1}: frames must be file names")
        elif not isinstance(video, str) or not video:
            raise bad(f"video {k + 1} must be a file or folder name, or a list of frame files")
        elif video.lower().endswith(FRAME_SUFFIXES):
            raise bad(f"video {k + 1} ({video}) is an image file; the frames of one video go in a nested list: "
                      f"\"video\": [[\"frame1.jpg\", \"frame2.jpg\"]]")
    return videos


def _fps(value, num_videos: int, bad) -> list[float]:
    values = value if isinstance(value, list) else [value] * num_videos
    if len(values) != num_videos or not all(isinstance(v, (int, float)) and v > 0 for v in values):
        raise bad(f"'fps' must be a positive number or one per video ({num_videos})")
    return [float(v) for v in values]


def _placed_tags(turns: list[Turn], num_images: int, num_videos: int, bad) -> list[Turn]:
    for tag in (IMAGE_TAG, VIDEO_TAG):
        if any(tag in t.content for t in turns if t.role != "user"):
            raise bad(f"an {tag} tag outside a user turn")
    num_image_tags = sum(t.content.count(IMAGE_TAG) for t in turns)
    num_video_tags = sum(t.content.count(VIDEO_TAG) for t in turns)
    if num_image_tags == num_video_tags == 0 and num_images + num_videos:
        first = next(k for k, t in enumerate(turns) if t.role == "user")
        tags = (IMAGE_TAG + "\n") * num_images + (VIDEO_TAG + "\n") * num_videos
        turns = [*turns[:first], Turn("user", tags + turns[first].content), *turns[first + 1:]]
    elif num_image_tags != num_images:
        raise bad(f"{num_image_tags} {IMAGE_TAG} tag(s) but {num_images} image(s)")
    elif num_video_tags != num_videos:
        raise bad(f"{num_video_tags} {VIDEO_TAG} tag(s) but {num_videos} video(s)")
    return turns
